#!/usr/bin/env bash
# Install Debian's Chromium and its ChromeDriver for the dashboard's browser test
# (tests/test_dashboard_browser.py), unless they are already there. The test never downloads a browser:
# it drives /usr/bin/chromium through /usr/bin/chromedriver, the pair Debian ships at the same version.
# Needs root (CI runs as root); elsewhere it says what to run and exits 0, and the test skips off CI.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install_chromium.sh: not root; run: sudo apt-get install -y chromium chromium-driver" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# the package lists may be missing or stale on a fresh machine; a failed update still lets a cached list try
apt-get update -qq || true
apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
chromium --version
