"""Starting the API server for ``tokenmill serve``: uvicorn in this process, or ``--workers N`` processes on one
socket, and the one stdout line ``ready on URL`` once requests are accepted (what a script starting it waits for).

With one process, uvicorn runs the app built here; with several, each worker builds its own from the settings
handed through the environment (:data:`service.api.app.SETTINGS_ENV`), and one of them runs the jobs and the
schedules (a lock in the state folder decides which).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from typing import Any

import uvicorn
from uvicorn.supervisors.multiprocess import Multiprocess

from service.api.app import SETTINGS_ENV, create_app
from service.api.server import uvicorn_options
from service.settings import Settings

EXIT_OK, EXIT_FAILURE = 0, 1
#: seconds ``tokenmill serve --workers N`` waits for a first worker to start before it stops watching for one
READY_S = 120.0


def serve(settings: Settings, host: str, port: int, log_level: str, workers: int) -> int:
    """Serve until SIGINT or SIGTERM: 0, or 1 when one process's server did not start (the lifespan or the bind
    failed: logged)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    roots = settings.roots()
    print(f"tokenmill serve: http://{host}:{port}  state {settings.state_dir.resolve()}  "
          f"read roots {', '.join(map(str, roots.read))}  write roots {', '.join(map(str, roots.write))}",
          file=sys.stderr, flush=True)
    common: dict[str, Any] = {"host": host, "port": port, "log_level": log_level,
                              "timeout_graceful_shutdown": 5, **uvicorn_options(settings)}
    if workers == 1:
        server = _ReadyServer(uvicorn.Config(create_app(settings), **common))
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn raises the SIGINT it caught again once it stopped
            server.run()
        return EXIT_OK if server.started else EXIT_FAILURE
    # worker processes import the app: they get the settings through the environment
    os.environ[SETTINGS_ENV] = settings.model_dump_json()
    config = uvicorn.Config("service.api.app:app_from_env", factory=True, workers=workers, **common)
    sock = config.bind_socket()
    try:
        with contextlib.suppress(KeyboardInterrupt):
            _ReadyWorkers(config, sockets=[sock]).run()
    finally:
        sock.close()
    return EXIT_OK


def _ready(host: str, port: int) -> None:
    """The one stdout line saying the server accepts requests (what a script starting it waits for)."""
    print(f"ready on http://{f'[{host}]' if ':' in host else host}:{port}", flush=True)


class _ReadyServer(uvicorn.Server):
    """uvicorn's server, saying :func:`_ready` once its startup is complete: the lifespan ran (the database is
    migrated, the job runner started) and the socket listens. ``--port 0``: the port the OS gave."""

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit:
            _ready(self.config.host, self.servers[0].sockets[0].getsockname()[1])


class _ReadyWorkers(Multiprocess):
    """uvicorn's ``--workers`` supervisor, saying :func:`_ready` once a worker reports its server started
    (uvicorn's readiness pipe to each worker), waiting at most :data:`READY_S` or until a signal arrives."""

    def init_processes(self) -> None:
        super().init_processes()
        deadline = time.monotonic() + READY_S
        while not self.signal_queue and time.monotonic() < deadline:
            if any(p.is_ready(timeout=0.5) for p in self.processes if p.process.is_alive()):
                _ready(self.config.host, self.sockets[0].getsockname()[1])
                return
            if not any(p.process.is_alive() for p in self.processes):
                return  # every worker failed its startup (logged); uvicorn's supervisor takes it from here
            time.sleep(0.1)
