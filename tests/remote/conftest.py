"""The Ray workers' tests run on a real cluster of several nodes on this machine, one per
module (a cluster takes seconds to start), in the slow selection: ``-m slow``."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.ray_cluster import LocalCluster, assert_gone, local_cluster, worker_processes

ROOT = Path(__file__).resolve().parents[2]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """The module's cluster: a head node (the driver's: this process) with ``HEAD_CPUS``
    and a worker node per entry of the module's ``NODES``."""
    pytest.importorskip("ray")
    head = getattr(request.module, "HEAD_CPUS", 1)
    nodes = getattr(request.module, "NODES", [{"num_cpus": 2}])
    # The actors import the test datasets (tests.remote.datasets) as any module of the
    # user's: from their sys.path, which this gives them (a real cluster ships them with
    # a runtime_env, see docs/ray.md).
    # conveyor from this checkout too, whatever the environment's own install points at
    # (a worktree's tests run against its source, as the driver's PYTHONPATH says).
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}}
    with local_cluster(head, *nodes, runtime_env=env) as made:
        yield made


@pytest.fixture(autouse=True)
def no_worker_left(cluster: LocalCluster) -> Iterator[None]:
    """Every actor a test's loaders started is gone once the test is over."""
    yield
    gc.collect()  # an iterator kept by an exception's traceback
    assert_gone(worker_processes(cluster), "conveyor's Ray workers")
