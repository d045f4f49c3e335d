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
