#!/usr/bin/env bash
# Run a command in a private network namespace that has only loopback.
# Ray binds the machine's network address; in here that is 127.0.0.1, so a local Ray (and every
# test) can reach nothing but this machine's loopback: which also proves nothing is downloaded.
# Falls back to a user namespace when not root, and to running directly (with a warning) when
# namespaces are unavailable. PostgreSQL stays reachable through its Unix socket.
set -euo pipefail
if [ "${TOKENMILL_IN_NETNS:-}" = 1 ]; then exec "$@"; fi
export TOKENMILL_IN_NETNS=1
inner='ip link set lo up 2>/dev/null || true; exec "$@"'
if unshare --net true 2>/dev/null; then
  exec unshare --net bash -c "$inner" bash "$@"
elif unshare --user --map-root-user --net true 2>/dev/null; then
  exec unshare --user --map-root-user --net bash -c "$inner" bash "$@"
else
  echo "netns.sh: no network namespace available; running on the host network" >&2
  exec "$@"
fi
