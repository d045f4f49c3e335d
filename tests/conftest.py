"""Shared fixtures. Tests that need Ray use ``ray_local`` (a real local node of the module's own) or
``ray_shared`` (a node that the next modules asking for it reuse).

``ray_local`` is per module, not per session: a single driver kept for the whole suite (tens of jobs, thousands
of actors) hung once past ten minutes in Ray itself (actor calls never answered); a fresh node per module keeps
every module independent of the ones before it. Modules whose Ray work is a few small in-process jobs ask for
``ray_shared`` instead: they run together at the end of the session (:func:`pytest_collection_modifyitems`), and
one node serves up to :data:`MODULES_PER_NODE` of them, so they do not each pay a node's start and stop while a
node's life stays short. Every other module starts without Ray, as before: a shared node still up is stopped
before it.

The whole suite runs inside a private network namespace (scripts/netns.sh), where Ray binds loopback.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: modules one shared node serves before it is replaced by a fresh one
MODULES_PER_NODE = 6


class _Shared:
    """The shared node, when this process started it: how many modules it served; which modules ask for it."""

    up = False
    served = 0
    modules: frozenset[Path] = frozenset()


def _start_ray() -> None:
    from pipeline.job.ray_env import init_ray

    init_ray(num_cpus=int(os.environ.get("TOKENMILL_TEST_CPUS", "2")))


def _stop_shared() -> None:
    if _Shared.up:
        import ray

        ray.shutdown()
    _Shared.up, _Shared.served = False, 0


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that ask for ``ray_shared`` last, together, those of them with a ``no_ray`` test first (no node
    is up yet there); a stable sort: each module keeps its place among its kind."""
    def using(name: str) -> frozenset[Path]:
        return frozenset(i.path for i in items if name in getattr(i, "fixturenames", ()))

    _Shared.modules, no_ray = using("ray_shared"), using("no_ray")
    items.sort(key=lambda i: 0 if i.path not in _Shared.modules else 1 if i.path in no_ray else 2)


def pytest_sessionfinish() -> None:
    _stop_shared()


@pytest.fixture(scope="module", autouse=True)
def _no_shared_ray_here(request: pytest.FixtureRequest) -> None:
    """A module that does not ask for the shared node starts without it."""
    if request.node.path not in _Shared.modules:
        _stop_shared()


@pytest.fixture(scope="module")
def ray_local() -> Iterator[Any]:
    """A local node for this module alone (a Ray this process already runs otherwise, e.g. one a test started)."""
    import ray

    from pipeline.job.ray_env import configure_data_context

    _stop_shared()
    if ray.is_initialized():
        configure_data_context()
        yield ray
        return
    _start_ray()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_shared() -> Any:
    """A local node that later modules asking for it reuse: for a few small in-process jobs, nothing that counts,
    kills or tunes Ray's processes."""
    import ray

    from pipeline.job.ray_env import configure_data_context

    if _Shared.served >= MODULES_PER_NODE or (_Shared.up and not ray.is_initialized()):
        _stop_shared()
    if ray.is_initialized():
        configure_data_context()
    else:
        _start_ray()
        _Shared.up = True
    _Shared.served += 1
    return ray


@pytest.fixture
def no_ray() -> None:
    """A test that checks something starts no Ray: the shared node, if up, is stopped first."""
    import ray

    _stop_shared()
    assert not ray.is_initialized(), "Ray runs in this process, not started by a fixture"


@pytest.fixture(scope="session")
def s3_endpoint():
    """A local S3 server (moto) for the whole session; skipped, with the reason, where moto is missing."""
    pytest.importorskip("moto", reason="moto[server] is in the test extra: pip install -e '.[test]'")
    from tests.s3_server import moto_server

    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def bucket(s3_endpoint):
    from tests.s3_server import new_bucket

    return new_bucket()
