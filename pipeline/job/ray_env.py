"""Connect to Ray: a local node by default (the embedded mode), or an existing cluster by address."""

from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import socket
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import ray
import ray._raylet
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
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
    config = getattr(ray._raylet, "Config", None)  # older/newer Ray may have none
    try:  # Ray reads its config when first imported; make this process see the new mode
        if config is not None:
            config.initialize("")
    except AttributeError:  # pragma: no cover - a Config without initialize
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


#: set to 1 (``tokenmill --verbose`` does) to let Ray print its own logs instead of routing them to ``ray.log``
VERBOSE_ENV = "TOKENMILL_VERBOSE"
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(filename)s:%(lineno)d -- %(message)s"


def verbose_default() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip() not in ("", "0")


def start_target(address: str | None = None) -> str:
    """What :func:`init_ray` will do, for the ``ray_starting`` event: ``local`` (a new node), the cluster's
    address (``address`` or RAY_ADDRESS), or the GCS address of the Ray this process already runs."""
    if ray.is_initialized():
        return str(ray.get_runtime_context().gcs_address)
    return address or os.environ.get("RAY_ADDRESS") or "local"


@dataclass(frozen=True)
class RayInfo:
    address: str
    cpus: int
    dashboard: str | None


def ray_info() -> RayInfo:
    """The Ray this process is connected to: its GCS address, the CPUs it reports, its dashboard (if any)."""
    node = getattr(ray._private.worker, "_global_node", None)
    dashboard = getattr(node, "webui_url", None) if node is not None else None
    return RayInfo(str(ray.get_runtime_context().gcs_address), int(ray.cluster_resources().get("CPU", 0)),
                   f"http://{dashboard}" if dashboard and "://" not in dashboard else dashboard or None)


def init_ray(address: str | None = None, num_cpus: int | None = None, log_path: str | None = None,
             verbose: bool | None = None) -> bool:
    """Start or join Ray once per process; returns True when this call started it.

    Unless ``verbose`` (default: the ``TOKENMILL_VERBOSE`` environment variable), Ray's own output goes
    to ``log_path`` (default: ``tokenmill-driver-<pid>.log`` in Ray's session log folder) instead of the
    terminal: see :func:`route_ray_logs`.
    """
    if ray.is_initialized():
        configure_data_context()  # a caller that started Ray itself still gets ordered output
        if log_path and _ROUTING is not None:  # a later job in a process whose Ray we started
            route_ray_logs(log_path)
        return False
    # No address: RAY_ADDRESS (set by Ray's job submission and KubeRay's RayJob), else a NEW local node.
    # Never ray.init()'s own default, which attaches to whatever cluster was started last on the machine
    # (a stray `ray start` would silently run the job, with its own CPUs and environment).
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        _prepare_local_auth()
    else:
        check_reachable(address)
    verbose = verbose_default() if verbose is None else verbose
    QuietRayWarnings.own_node_default = address is None  # every actor on a node this process starts is the job's
    os.environ.setdefault("RAY_USAGE_STATS_PROMPT_ENABLED", "0")  # a nightly wheel's notice, printed to stdout
    if not verbose:  # before ray.init: the driver's C++ core prints while it starts
        route_ray_logs(log_path or _provisional_log_path())
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(
            address=address or "local",
            num_cpus=num_cpus if address is None else None,
            include_dashboard=False,
            # quiet: workers' stdout/stderr stay in their files in Ray's session log folder
            log_to_driver=verbose,
            logging_level=logging.INFO,
            configure_logging=True,
            runtime_env=None,
        )
    finally:  # also when the start fails (a node that timed out during startup)
        if callable(sigterm) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm)  # ray.init replaces it with sys.exit: keep the caller's (a cancel)
    if not verbose:
        if log_path is None:
            _move_into_session_dir()
        _route_python_loggers()  # ray.init may have added or reformatted handlers
    for lg in _ray_loggers():  # --verbose too: Ray's console handlers
        for h in lg.handlers:
            if not any(isinstance(f, QuietRayWarnings) for f in h.filters):
                h.addFilter(QuietRayWarnings(level=h.level))
    configure_data_context()
    return True


def configure_data_context() -> None:
    """Deterministic output needs Ray Data to keep block order; progress goes to our own CLI; a stage's own error
    reaches the driver as raised (not a ``UserCodeException``, whose cause is lost on the way: a full disk's
    ENOSPC would read as a bug)."""
    ctx = DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.raise_original_map_exception = True
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.verbose_stats_logs = False


# ---- where Ray's own output goes ----------------------------------------------------------------------


class QuietRayWarnings(logging.Filter):
    """Demotes to INFO the warnings Ray writes on a healthy run, so a warning in ``ray.log`` (or, with
    ``--verbose``, on the terminal) means something: a handler filter, so it sees every Ray logger's records,
    and the Python warnings and relayed lines :func:`route_ray_logs` writes itself.

    - "Failed to determine local IP ... 8.8.8.8": no route to the internet, Ray falls back to the hostname;
    - "Progress bars disabled": tokenmill disabled them (:func:`configure_data_context`) and shows its own;
    - "Usage stats collection ...": a notice, not a problem;
    - "The maximum number of concurrent tasks for ... only received N input(s)": a small input, nothing wrong;
    - "The Dataset job will hang unless more CPUs are freed up": on a node this process started (``own_node``)
      the CPUs are held by the job's own actors of the stage before, which end as the next one starts.

    A filter runs after the logger compared the record's level with the handler's, so one demoted here would
    still be written by a handler at WARNING (a console): ``level`` is that handler's, and a record demoted
    below it is dropped.
    """

    ALWAYS = re.compile(r"Failed to determine local IP|Progress bars disabled|Usage stats collection"
                        r"|The maximum number of concurrent tasks for .* only received \d+ input")
    OWN_NODE = re.compile(r"The Dataset job will hang unless more CPUs")

    #: ``own_node`` of filters made without one: set by :func:`init_ray` when it starts the node
    own_node_default = False

    def __init__(self, own_node: bool | None = None, level: int = logging.NOTSET) -> None:
        super().__init__()
        self._own_node = own_node
        self.level = level
        #: warnings demoted so far
        self.demoted = 0

    @property
    def own_node(self) -> bool:
        return self.own_node_default if self._own_node is None else self._own_node

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING:
            text = record.getMessage()
            if self.ALWAYS.search(text) or (self.own_node and self.OWN_NODE.search(text)):
                record.levelno, record.levelname = logging.INFO, "INFO"
                self.demoted += 1
        return record.levelno >= self.level


#: the filter of ray.log's handler (INFO: demoted lines are kept there, as INFO)
QUIET = QuietRayWarnings(level=logging.INFO)


@dataclass
class _Routing:
    path: Path
    handler: logging.FileHandler
    #: the stream fd 2 was before it was pointed at the log (the terminal, a pipe)
    saved_fd: int
    #: ``sys.stderr`` before it was rebound to ``saved_fd``; None when it was left alone
    saved_stderr: TextIO | None
    #: :func:`warnings.showwarning` before it was replaced by :func:`_show_warning`
    saved_showwarning: Callable[..., None]
    #: console handlers taken off Ray's loggers, to put back on :func:`restore_ray_logs`
    removed: list[tuple[logging.Logger, logging.Handler]] = field(default_factory=list)


_ROUTING: _Routing | None = None
_RAY_DIR = os.path.dirname(ray.__file__) + os.sep
_ORIG_SHOWWARNING = warnings.showwarning


def route_ray_logs(log_path: str | os.PathLike[str]) -> Path:
    """Send Ray's own output to ``log_path`` (appended, a job's ``ray.log``): the only way to keep a terminal, and
    the job's own log, free of it.

    Ray writes in four ways, each routed here:

    - its C++ core (the driver's core worker: ``W``/``E`` glog lines such as "Failed to determine local
      IP" and actor warnings) writes straight to file descriptor 2, so fd 2 of this process is pointed at
      the log, and ``sys.stderr`` is rebound to a copy of the original fd 2: Python's own messages,
      tracebacks and the CLI's lines still reach the terminal;
    - its Python loggers (``ray``, ``ray.data``: INFO lines, "Progress bars disabled", resource
      warnings) lose their console handlers and write to the log;
    - Python warnings raised inside the ``ray`` package (deprecations) are written to the log;
    - the driver's thread that relays the raylet's error messages (``(raylet) A worker died ...``) and,
      with ``log_to_driver``, workers' output prints with ``print``: those lines are written to the log.

    Process-wide, and kept until :func:`restore_ray_logs` (Ray's core may print until the process
    exits); a second call moves everything to the new path.
    """
    global _ROUTING
    path = Path(log_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.INFO)  # Ray Data's DEBUG lines stay in its own ray-data.log
    handler.addFilter(QUIET)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if _ROUTING is None:
        saved_fd = os.dup(2)
        saved_stderr = None
        if _is_fd2(sys.stderr):
            saved_stderr = sys.stderr
            sys.stderr = os.fdopen(os.dup(saved_fd), "w", buffering=1, encoding=getattr(saved_stderr, "encoding", None),
                                   errors="backslashreplace")
        _ROUTING = _Routing(path, handler, saved_fd, saved_stderr, warnings.showwarning)
        warnings.showwarning = _show_warning
        _route_relayed_prints()
    else:
        old = _ROUTING.handler
        for lg in _ray_loggers():
            if old in lg.handlers:
                lg.removeHandler(old)
        old.close()
        _ROUTING.handler, _ROUTING.path = handler, path
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    _route_python_loggers()
    return path


def restore_ray_logs() -> None:
    """Undo :func:`route_ray_logs`: fd 2, ``sys.stderr``, Ray's console handlers and warnings as before."""
    global _ROUTING
    routing, _ROUTING = _ROUTING, None
    if routing is None:
        return
    os.dup2(routing.saved_fd, 2)
    os.close(routing.saved_fd)
    if routing.saved_stderr is not None:
        current, sys.stderr = sys.stderr, routing.saved_stderr
        current.close()
    for lg in _ray_loggers():
        if routing.handler in lg.handlers:
            lg.removeHandler(routing.handler)
    for lg, h in routing.removed:
        lg.addHandler(h)
    routing.handler.close()
    warnings.showwarning = routing.saved_showwarning


def ray_log_path() -> Path | None:
    """Where Ray's output goes now (None: to the terminal)."""
    return _ROUTING.path if _ROUTING else None


def _is_fd2(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.fileno() == 2
    except (AttributeError, OSError, ValueError):  # pytest's capture, a StringIO
        return False


def _ray_loggers() -> list[logging.Logger]:
    names = [n for n in list(logging.root.manager.loggerDict) if n == "ray" or n.startswith("ray.")]
    return [logging.getLogger(n) for n in sorted(set(names) | {"ray"})]


def _route_python_loggers() -> None:
    """Ray's loggers that print to a console (``ray``, and ``ray.data`` which does not propagate) log to
    the file instead; their file handlers (``ray-data.log``) stay."""
    routing = _ROUTING
    if routing is None:
        return
    routing.handler.setFormatter(logging.Formatter(_LOG_FORMAT))  # ray.init re-formats the handlers of "ray"
    for lg in _ray_loggers():
        console = [h for h in lg.handlers
                   if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
        for h in console:
            lg.removeHandler(h)
            routing.removed.append((lg, h))
        # every logger that printed (also those a previous route_ray_logs call took the console from)
        printed = lg.name == "ray" or any(owner is lg for owner, _ in routing.removed)
        if printed and routing.handler not in lg.handlers:
            lg.addHandler(routing.handler)


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    """Warnings raised inside Ray go to the log; every other warning is shown as usual."""
    routing = _ROUTING
    if routing is not None and (filename.startswith(_RAY_DIR) or category.__module__.split(".")[0] == "ray"):
        _log_text(routing, "py.warnings", logging.WARNING,
                  warnings.formatwarning(message, category, filename, lineno, line).rstrip())
        return
    (routing.saved_showwarning if routing else _ORIG_SHOWWARNING)(message, category, filename, lineno, file, line)


def _log_text(routing: _Routing, name: str, level: int, text: str) -> None:
    routing.handler.handle(logging.makeLogRecord({"name": name, "levelno": level,
                                                  "levelname": logging.getLevelName(level), "msg": text}))


def _route_relayed_prints() -> None:
    """Ray's driver prints what the raylet and the workers send it (``print_to_stdstream``): while the logs are
    routed those lines go to the log. Patched once, on the module the relay threads look the function up in."""
    worker_mod = getattr(getattr(ray, "_private", None), "worker", None)
    original = getattr(worker_mod, "print_to_stdstream", None)
    if worker_mod is None or original is None or getattr(original, "tokenmill_routed", False):
        return

    def print_to_stdstream(data: dict[str, Any], ignore_prefix: bool) -> None:
        routing = _ROUTING
        if routing is None:
            return original(data, ignore_prefix)
        who = data.get("pid", "")
        who = f"{data.get('actor_name') or data.get('task_name') or ''} pid={who}".strip() if who != "raylet" else who
        for line in data.get("lines", []):
            _log_text(routing, "ray.relayed", logging.WARNING if data.get("is_err") else logging.INFO,
                      f"({who}) {line}")

    print_to_stdstream.tokenmill_routed = True  # type: ignore[attr-defined]
    worker_mod.print_to_stdstream = print_to_stdstream


def _provisional_log_path() -> Path:
    """Before Ray has a session folder, the log starts in the temp folder (moved there after init)."""
    folder = Path(tempfile.gettempdir()) / f"tokenmill-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder / f"tokenmill-driver-{os.getpid()}.log"


def _move_into_session_dir() -> None:
    """The default log belongs next to Ray's own logs; renaming keeps every open descriptor valid."""
    routing = _ROUTING
    node = getattr(ray._private.worker, "_global_node", None)
    if routing is None or node is None:
        return
    try:
        target = Path(node.get_logs_dir_path()) / routing.path.name
        os.replace(routing.path, target)
    except (OSError, AttributeError):  # another filesystem, a client connection: the log stays where it is
        return
    routing.path = target
    routing.handler.baseFilename = str(target)
