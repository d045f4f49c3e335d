"""Shared fixtures. Tests that need Ray use ``ray_local``: one real local node per test module.

Per module, not per session: a single driver kept for the whole suite (tens of jobs, thousands of
actors) hung once past ten minutes in Ray itself (actor calls never answered); a fresh node per module
costs a few seconds and keeps every module independent of the ones before it.

The whole suite runs inside a private network namespace (scripts/netns.sh), where Ray binds loopback.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def ray_local():
    import ray

    from pipeline.job.ray_env import configure_data_context, init_ray

    if ray.is_initialized():
        configure_data_context()
        yield ray
        return
    init_ray(num_cpus=int(os.environ.get("TOKENMILL_TEST_CPUS", "2")))
    yield ray
    ray.shutdown()


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
