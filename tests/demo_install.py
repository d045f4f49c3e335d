"""An environment in which Python imports only what ``make demo`` installs, inside the suite's fuller venv.

``make test`` installs ``.[test]``, a superset of ``make demo``'s ``.[demo]``: a README command that works in the
suite might still fail after ``make demo`` with a ``ModuleNotFoundError``. Installing a second venv per run would
take minutes; instead :func:`demo_install_env` returns an environment whose every Python process (subprocesses and
Ray workers, which inherit it) refuses to import a module that only distributions outside ``make demo``'s
install provide. What ``make demo`` installs is read from the Makefile (``DEMO_EXTRAS``, ``LID_PACKAGE``), the
extras from ``pyproject.toml`` and the rest of the closure from the installed distributions' metadata, so a change
to what ``make demo`` installs changes what the README's tests may import.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import json
import os
import re
import shutil
import sysconfig
import tempfile
import tomllib
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
#: what ``python -m venv`` puts in every venv before ``make demo`` installs anything
VENV_SEED = ("pip", "setuptools")

#: loaded by Python at start-up from ``PYTHONPATH``: every finder of ``sys.meta_path`` wrapped so that it does not
#: find the modules listed in ``blocked.json`` beside it. Not finding (rather than raising) keeps a probe such as
#: ``importlib.util.find_spec(name) is None`` answering as it would were the module not installed.
SITECUSTOMIZE = '''\
import json
import sys
from pathlib import Path

_BLOCKED = frozenset(json.loads(Path(__file__).with_name("blocked.json").read_text()))


class _Blocking:
    """A finder that finds what ``finder`` does, except the blocked modules (``find_distributions`` and the rest
    pass through, so importlib.metadata still sees every distribution)."""

    def __init__(self, finder):
        self._finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            return None
        return self._finder.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self._finder, attr)


sys.meta_path[:] = [_Blocking(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
'''


def makefile_var(name: str, makefile: Path = REPO / "Makefile") -> str:
    """The value of ``NAME := VALUE`` (or ``=``) in the Makefile."""
    found = re.search(rf"^{re.escape(name)}\s*:?=\s*(.*?)\s*$", makefile.read_text(encoding="utf-8"), re.MULTILINE)
    if not found:
        raise LookupError(f"the Makefile sets no {name}")
    return found.group(1)


def demo_extras() -> tuple[str, ...]:
    """The extras ``make demo`` installs (``pip install -e '.[DEMO_EXTRAS]'``)."""
    return tuple(e.strip() for e in makefile_var("DEMO_EXTRAS").split(",") if e.strip())


def _wanted(req: Requirement, extras: Iterable[str]) -> bool:
    return req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *extras))


def _own_requirements(extras: Iterable[str]) -> list[Requirement]:
    """What tokenmill with ``extras`` requires, as pyproject.toml declares it now (the installed metadata of an
    editable install may be older)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    optional = project.get("optional-dependencies", {})
    texts = [*project["dependencies"], *(t for e in extras for t in optional[e])]
    return [r for r in map(Requirement, texts) if _wanted(r, ())]


def requirements(name: str, extras: Iterable[str]) -> list[Requirement]:
    """What the distribution ``name`` with ``extras`` requires, by its installed metadata (tokenmill's by
    pyproject.toml); nothing for one not installed here (a marker for another platform)."""
    if name == "tokenmill":
        return _own_requirements(extras)
    try:
        return [r for r in map(Requirement, metadata.requires(name) or ()) if _wanted(r, extras)]
    except metadata.PackageNotFoundError:
        return []


def closure(extras: Iterable[str], seeds: Iterable[str] = ()) -> set[str]:
    """The distributions (canonical names) that ``pip install 'tokenmill[EXTRAS]'`` installs, plus ``seeds``."""
    done: dict[str, set[str]] = {}
    work = [("tokenmill", set(extras))]
    while work:
        name, wanted = work.pop()
        if name in done and wanted <= done[name]:
            continue
        done[name] = done.get(name, set()) | wanted
        work += [(canonicalize_name(r.name), set(r.extras)) for r in requirements(name, done[name])]
    return set(done) | {canonicalize_name(s) for s in seeds}


def blocked_modules(extras: Iterable[str]) -> set[str]:
    """Top-level modules installed here that only distributions outside ``make demo``'s install provide; the
    standard library and the repository's own packages are never in it."""
    lid = Requirement(makefile_var("LID_PACKAGE")).name  # installed with --no-deps
    allowed = closure(extras, (*VENV_SEED, lid))
    own = {p.stem for p in REPO.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    return {module for module, dists in _installed_modules().items()
            if module not in own and not any(canonicalize_name(d) in allowed for d in dists)}


def _installed_modules() -> dict[str, list[str]]:
    """Top-level module -> the distributions pip installed that provide it, read from site-packages only: a copy
    a package vendors on a path of its own (Ray adds ``ray/thirdparty_files``, with colorama, to ``sys.path`` once
    imported) comes with that package, not from a distribution of its own."""
    site = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    found: dict[str, list[str]] = {}
    for dist in metadata.distributions(path=sorted(site)):
        for module in _top_level(dist):
            found.setdefault(module, []).append(dist.metadata["Name"])
    return found


def _top_level(dist: metadata.Distribution) -> set[str]:
    """The top-level import names of ``dist``, as ``importlib.metadata.packages_distributions`` reads them."""
    listed = set((dist.read_text("top_level.txt") or "").split())
    inferred = {f.parts[0] if len(f.parts) > 1 else inspect.getmodulename(str(f)) for f in dist.files or ()}
    return listed or {name for name in inferred if name and not name.endswith(".dist-info")}


@functools.cache
def _blocker_dir(modules: frozenset[str]) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="import-blocker-"))
    atexit.register(shutil.rmtree, folder, True)
    (folder / "blocked.json").write_text(json.dumps(sorted(modules)), encoding="utf-8")
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    return folder


def blocking_env(env: dict[str, str], modules: Iterable[str]) -> dict[str, str]:
    """``env`` in which Python does not find ``modules`` (top-level names, with their submodules), as if they were
    not installed: importing one raises ``ModuleNotFoundError``."""
    path = [str(_blocker_dir(frozenset(modules))), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {**env, "PYTHONPATH": os.pathsep.join(path)}


@functools.cache
def _demo_blocked() -> frozenset[str]:
    return frozenset(blocked_modules(demo_extras()))


def demo_install_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` in which Python imports only what ``make demo`` installs (plus the standard library and this
    repository); ``blocked.json`` in the folder first on its ``PYTHONPATH`` lists what it refuses."""
    return blocking_env(env, _demo_blocked())
