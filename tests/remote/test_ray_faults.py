"""Ray workers fail as a cluster fails, and every epoch stays exact: a worker's process
killed, a node lost mid-epoch, a straggler holding the head of the line, a sample that
crashes its worker, a worker the cluster cannot place, and the cluster itself lost.
Each is provoked for real, and no worker process is left behind (conftest.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from conveyor import (
    ClusterCapacityWarning,
    DataLoader,
    WorkerRestartedWarning,
    WorkerTimeoutError,
)
from tests.helpers.ray_cluster import LocalCluster, assert_gone

from . import datasets as ds

pytestmark = pytest.mark.timeout(600)  # a worker started many times over on busy cores

HEAD_CPUS = 1
NODES = [{"num_cpus": 2}]
SMALL = {"num_cpus": 0.5}
SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).resolve().parents[2]


def _loader(dataset: Any, **kwargs: Any) -> DataLoader:
    kwargs.setdefault("batch_size", 3)
    kwargs.setdefault("num_workers", 2)
    kwargs.setdefault("worker_options", SMALL)
    return DataLoader(dataset, worker_method="ray", **kwargs)


def _indices(batches: list[Any]) -> list[int]:
    return [i for batch in batches for i in batch["i"].tolist()]


def test_a_worker_killed_mid_epoch_is_replaced_and_every_index_comes_once(
    cluster: LocalCluster,
) -> None:
    loader = _loader(ds.Where(24), max_worker_restarts=1)
    it = iter(loader)
    first = next(it)
    victim, worker = int(first["pid"][0]), int(first["worker"][0])
    os.kill(victim, signal.SIGKILL)  # as the OOM killer would, from outside
    with pytest.warns(WorkerRestartedWarning, match="its process died") as caught:
        rest = list(it)
    assert _indices([first, *rest]) == list(range(24))
    assert "no sample is lost or repeated" in str(caught[0].message)
    pids = [int(b["pid"][0]) for b in [first, *rest] if int(b["worker"][0]) == worker]
    assert pids[0] == victim and pids[-1] != victim  # its last batches: the replacement's
    assert loader.statistics().worker_restarts == 1  # type: ignore[union-attr]


def test_set_epoch_reaches_every_actor_and_the_replacement_of_one_killed(
    cluster: LocalCluster,
) -> None:
    """Persistent actors keep the copy of the dataset they started with (as the object
    store holds it since); each is told of ``set_epoch`` as an epoch starts, and an actor
    started in place of a killed one is told before its first task of the epoch."""
    dataset = ds.Epochs(24)
    loader = _loader(dataset, persistent_workers=True, max_worker_restarts=1)
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        assert {e for batch in loader for e in batch["epoch"].tolist()} == {epoch}
    dataset.set_epoch(2)
    it = iter(loader)
    first = next(it)
    dataset.set_epoch(7)  # for the next epoch, not this one
    victim = int(first["pid"][0])
    os.kill(victim, signal.SIGKILL)
    with pytest.warns(WorkerRestartedWarning, match="its process died"):
        rest = list(it)
    batches = [first, *rest]
    assert _indices(batches) == list(range(24))
    assert {e for batch in batches for e in batch["epoch"].tolist()} == {2}
    before = {int(p) for p in first["pid"]} | {victim}
    assert {int(p) for batch in rest for p in batch["pid"]} - before, "no replacement served"
    assert {e for batch in loader for e in batch["epoch"].tolist()} == {7}
    del it, loader


def test_a_node_lost_mid_epoch_costs_its_workers_not_a_sample(cluster: LocalCluster) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    doomed = cluster.add_node(num_cpus=2)
    # Both workers on the doomed node, and anywhere once it is gone (soft affinity).
    there = NodeAffinitySchedulingStrategy(doomed.node_id, soft=True)
    options = {**SMALL, "scheduling_strategy": there}
    # Until Ray declares the node dead (a second or so), a replacement may still be placed
    # there, and die too: the budget allows each worker two deaths.
    loader = _loader(ds.Where(30), worker_options=options, max_worker_restarts=4)
    it = iter(loader)
    first = [next(it), next(it)]
    assert {node for batch in first for node in batch["node"]} == {doomed.node_id}
    processes = cluster.remove_node(doomed)
    # Ray says "unavailable" while the node's death is not yet known, "its node died" after.
    lost = r"its node was lost|Ray could not reach it"
    with pytest.warns(WorkerRestartedWarning, match=lost) as caught:
        rest = list(it)
    assert _indices(first + rest) == list(range(30))
    assert doomed.node_id not in {node for batch in rest[-2:] for node in batch["node"]}
    assert all("restart" in str(w.message) for w in caught)
    assert_gone(processes, "the lost node's processes")


def test_a_straggler_past_timeout_is_replaced_and_its_task_resent(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Index 4 holds the head of the line (batch 1): its first fetch blocks on a FIFO
    nobody opens. Past ``timeout`` its worker is killed and the batch re-sent to a
    replacement, where it goes through. The replacement's start-up is not judged by
    ``timeout`` (on CI's busy cores one took more than 45 s, twice, and the run failed
    as a start-up that never succeeds): ``timeout`` is well above a task, not a start."""
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    loader = _loader(ds.Faulty(24, hold=4, gate=str(gate)), timeout=15, on_timeout="restart")
    with pytest.warns(WorkerRestartedWarning, match=r"past timeout=15, so conveyor killed it"):
        got = list(loader)
    assert _indices(got) == list(range(24))


def test_a_sample_that_crashes_its_worker_is_proven_and_left_out(cluster: LocalCluster) -> None:
    """Index 5 segfaults its worker every time. Ray does not say how a worker's process
    ended, so each death is weak evidence: the sample is named by the traced retry
    (through the cluster's key-value store), tried alone twice in a fresh worker, then
    left out, as a sample killed from outside is locally; nothing else is lost."""
    loader = _loader(ds.Faulty(16, segfault=(5,)), batch_size=4, on_error="skip", max_errors=1)
    with pytest.warns(WorkerRestartedWarning) as caught:
        got = _indices(list(loader))
    assert got == [i for i in range(16) if i != 5]
    (skipped,) = loader.skipped_samples
    assert skipped.index == 5 and skipped.stage == "killed"
    assert "its process died" in skipped.message
    reports = [str(w.message) for w in caught]
    assert any("at dataset index 5" in report for report in reports)
    assert "not counted against max_worker_restarts" in reports[-1]


def test_a_worker_the_cluster_cannot_place_times_out_instead_of_hanging(
    cluster: LocalCluster,
) -> None:
    """No node has what the workers ask for: a warning at iter() says so, and the
    timeout ends the wait Ray would make."""
    options = {"num_cpus": 0.5, "resources": {"a_resource_no_node_has": 1}}
    with (
        pytest.warns(ClusterCapacityWarning, match="2 of the DataLoader's 2 Ray workers"),
        pytest.raises(WorkerTimeoutError, match="start-up"),
    ):
        iter(_loader(ds.Where(6), worker_options=options, timeout=3))


class _Preempted(Exception):
    """What a training script's own SIGALRM or SIGTERM handler raises."""


def _preempted(signum: int, frame: Any) -> None:
    raise _Preempted(f"signal {signum}: save and exit")


def test_a_signal_handlers_exception_while_ray_waits_is_raised_as_itself(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """The loop blocks in Ray's wait for a sample that never comes; the script's signal
    handler raises. Ray lets only KeyboardInterrupt through its signal checks, so the
    handler's exception came back as a SystemError, read as the cluster lost; it is
    the script's own exception, and the workers are gone after (conftest.py)."""
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    it = iter(_loader(ds.Faulty(6, hold=0, gate=str(gate)), num_workers=1))
    previous = signal.signal(signal.SIGUSR2, _preempted)
    # (Not SIGALRM: pytest-timeout's own timer is on it.)
    sender = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGUSR2))
    try:
        sender.start()
        with pytest.raises(_Preempted, match="save and exit"):
            next(it)
    finally:
        sender.cancel()
        signal.signal(signal.SIGUSR2, previous)
        del it


def test_losing_the_cluster_is_an_error_not_a_hang(cluster: LocalCluster) -> None:
    """A driver with a cluster of its own (started by ray.init() in a fresh process) loses
    it mid-epoch: its processes are killed while a batch is awaited. The driver raises
    ClusterLostError, disconnects from Ray, lives on, and leaves no process behind."""
    temp = tempfile.mkdtemp(prefix="cvray", dir="/tmp")  # short: Ray's socket paths
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "lose_cluster.py"), temp],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr[-3000:]
    assert "ClusterLostError: The Ray cluster the DataLoader's workers run on" in out
    assert "its head node did not answer" in out and "ray.shutdown()" in out
    assert "resumes at batch 1" in out  # the state handed out so far survived
    listed = [line.split()[1:] for line in out.splitlines() if line.startswith(("PIDS", "LEFT"))]
    left = []
    for pid in (int(pid) for pids in listed for pid in pids):
        with contextlib.suppress(psutil.NoSuchProcess):
            left.append(psutil.Process(pid))
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if temp in " ".join(proc.cmdline()):
                left.append(proc)
    assert_gone(left, "the lost cluster's processes")
