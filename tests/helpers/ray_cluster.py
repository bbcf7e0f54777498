"""Real Ray clusters of several nodes on this machine, for the Ray workers' tests.

:func:`local_cluster` starts a head node and worker nodes (each its own raylet and
object store, as separate machines would have), connects this process to it, and on
the way out disconnects, stops every node and checks that none of their processes
(raylets, GCS, workers) is left. :func:`worker_processes` finds the processes of
conveyor's actors (titled ``ray::ConveyorWorker``) so a test can kill one, or check
that a loader left none behind.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil

# Fast failure detection: a removed node is declared dead in about a second.
SYSTEM_CONFIG = {
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 3,
    "health_check_initial_delay_ms": 0,
}
GONE_TIMEOUT_S = 30.0  # processes a killed actor or a stopped node leaves must exit by then
ACTOR_TITLE = "ray::ConveyorWorker"


@dataclass
class LocalCluster:
    cluster: Any  # ray.cluster_utils.Cluster
    seen: dict[int, psutil.Process] = field(default_factory=dict)  # every process it ran

    def add_node(self, **args: Any) -> Any:
        node = self.cluster.add_node(**args)
        self.cluster.wait_for_nodes()
        self.processes()
        return node

    def remove_node(self, node: Any) -> list[psutil.Process]:
        """Lose a node as a machine is lost: every process on it killed at once (its
        workers too, which Ray would let run on for a while after their raylet)."""
        self.processes()  # note its workers first
        procs = []
        for infos in node.all_processes.values():
            for info in infos:
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(info.process.pid)
                    procs += [proc, *proc.children(recursive=True)]
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        self.cluster.remove_node(node, allow_graceful=False)
        return procs

    def processes(self) -> list[psutil.Process]:
        """The nodes' processes (and their children) alive now; each is remembered."""
        nodes = [self.cluster.head_node, *self.cluster.worker_nodes]
        found = []
        for node in nodes:
            for infos in node.all_processes.values():
                for info in infos:
                    with contextlib.suppress(psutil.Error):
                        proc = psutil.Process(info.process.pid)
                        found += [proc, *proc.children(recursive=True)]
        for proc in found:
            self.seen.setdefault(proc.pid, proc)
        return found


def worker_processes(cluster: LocalCluster) -> list[psutil.Process]:
    """conveyor's actor processes, on every node, alive now."""
    found = []
    for proc in cluster.processes():
        with contextlib.suppress(psutil.Error):
            if " ".join(proc.cmdline()).startswith(ACTOR_TITLE):
                found.append(proc)
    return found


def assert_gone(procs: list[psutil.Process], what: str) -> None:
    """Block until ``procs`` have exited (GONE_TIMEOUT_S at most), else fail naming them."""
    _, alive = psutil.wait_procs(procs, timeout=GONE_TIMEOUT_S)
    assert not alive, f"{what} left behind: " + ", ".join(
        f"{p.pid} {' '.join(p.cmdline())[:80]}" for p in alive if p.is_running()
    )


@contextlib.contextmanager
def local_cluster(
    head_cpus: int = 1, *nodes: dict[str, Any], runtime_env: dict[str, Any] | None = None
) -> Iterator[LocalCluster]:
    """A head node with ``head_cpus`` and one worker node per ``nodes`` entry, this
    process connected to it (with ``runtime_env`` for its jobs); all of it stopped, and
    checked gone, on the way out."""
    import ray
    from ray.cluster_utils import Cluster

    args = {"num_cpus": head_cpus, "include_dashboard": False, "_system_config": SYSTEM_CONFIG}
    cluster = LocalCluster(Cluster(initialize_head=True, head_node_args=args))
    try:
        for node in nodes:
            cluster.add_node(**node)
        ray.init(address=cluster.cluster.address, log_to_driver=False, runtime_env=runtime_env)
        yield cluster
    finally:
        cluster.processes()
        ray.shutdown()
        cluster.cluster.shutdown()
        assert_gone(list(cluster.seen.values()), "the test cluster's processes")
