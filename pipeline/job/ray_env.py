"""Connect to Ray: a local node by default (the embedded mode), or an existing cluster by address."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
from pathlib import Path

import ray
from ray.data import DataContext


def _prepare_local_auth() -> None:
    """Ray >= 2.60 turns token auth on; a local node gets its token in a private temp folder.

    Honours a user's own RAY_AUTH_MODE / RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH when they set one.
    """
    if any(k in os.environ for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")):
        return
    folder = Path(tempfile.gettempdir()) / f"tokenmill-ray-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    token = folder / "auth_token"
    if not token.exists():
        import secrets

        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
    try:  # Ray reads its config when first imported; make this process see the new mode
        from ray._raylet import Config

        Config.initialize("")
    except (ImportError, AttributeError):  # pragma: no cover - older/newer Ray without it
        pass


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a cluster address nobody listens on: Ray itself retries for minutes."""
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", a bare host or a Jobs URL: leave it to Ray
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {hostport} ({exc.strerror or exc})") from None


def init_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Start or join Ray once per process; returns True when this call started it."""
    if ray.is_initialized():
        configure_data_context()  # a caller that started Ray itself still gets ordered output
        return False
    if address is None:
        _prepare_local_auth()
    else:
        check_reachable(address)
    ray.init(
        address=address,
        num_cpus=num_cpus if address is None else None,
        include_dashboard=False,
        log_to_driver=True,
        logging_level=logging.WARNING,
        configure_logging=True,
        runtime_env=None,
    )
    configure_data_context()
    return True


def configure_data_context() -> None:
    """Deterministic output needs Ray Data to keep block order; progress goes to our own CLI."""
    ctx = DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.verbose_stats_logs = False
    # Ray Data reports every finished dataset at INFO; the CLI prints its own progress lines
    logging.getLogger("ray.data").setLevel(logging.WARNING)
