"""A port for a server a test starts, chosen where nothing else on the machine is about to bind.

``bind(("127.0.0.1", 0))`` hands out a port from the kernel's ephemeral range, and the kernel may hand the
same port to the next ``bind(0)`` once the probe closes it. A Ray head binds a dozen ports (raylet, object
manager, agents) before its dashboard, each from that range, so a dashboard port chosen that way was
sometimes taken by the time the dashboard started (a CI failure: "address already in use"). Ports here come
from below the ephemeral range and above Ray's worker ports (10002-19999), at random so that two sessions
on one machine rarely pick the same one, and are checked free on 127.0.0.1.
"""

from __future__ import annotations

import random
import socket

LOW, HIGH = 20000, 32000  # Linux's ephemeral range starts at 32768; Ray's workers use 10002-19999


def ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A port in [LOW, HIGH) outside the ephemeral range that nothing listens on or holds now."""
    low_eph, high_eph = ephemeral_range()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(LOW, HIGH)
        if low_eph <= port <= high_eph:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {LOW}-{HIGH} outside the ephemeral range {low_eph}-{high_eph}")
