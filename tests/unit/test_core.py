"""The worker core, without a process: two cores in two threads keep apart.

Thread workers run several cores in one process. Whatever a core sets up for its
dataset (worker info, seeds, reseeding, ``per_worker`` resources, collate's flags) must
be that core's alone, however the two interleave: each thread's batches must be exactly
what the same core gives when it runs alone.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any

import numpy as np
import pytest

import conveyor
from conveyor._task.protocol import BatchDone, Ready, Stop, Task
from conveyor._workers.core import STOP, WorkerCore
from conveyor._workers.spec import UserObjects, WorkerSpec
from conveyor._workers.status import MemoryStatus
from conveyor.collate import default_collate

SAMPLES = 12
BATCH = 3


class Reference:
    """What a core's transport receives: the batch itself (threads share memory)."""

    arrays_as_tensors = False

    def collating(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def encode(self, batch: Any) -> Any:
        return batch


class Witness:
    """Each sample says which worker fetched it, what it drew from the worker's own
    generators and from the process's, and which per-worker resource it used. With a
    barrier, the two cores' samples are fetched in lockstep, interleaved."""

    def __init__(self, barrier: threading.Barrier | None = None) -> None:
        self.barrier = barrier
        self.resource = conveyor.per_worker(object)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self.barrier is not None:
            self.barrier.wait(timeout=30)
        info = conveyor.get_worker_info()
        assert info is not None
        return {
            "index": index,
            "worker": info.id,
            "seed": info.seed,
            "mine": info.rng.numpy_generator.integers(1 << 30),
            "py": info.rng.random_generator.random(),
            "resource": id(self.resource.get()),
            "vector": np.full(2, index, dtype=np.float32),
        }


def _spec(worker_id: int, base_seed: int, reseed: str, tensors_in_main: bool) -> WorkerSpec:
    return WorkerSpec(
        worker_id=worker_id,
        num_workers=2,
        base_seed=base_seed,
        iterable=False,
        auto_collation=True,
        drop_last=False,
        reseed=reseed,
        tensors_in_main=tensors_in_main,
        worker_method="thread",
    )


SPECS = [_spec(0, 1000, "sample", True), _spec(1, 2000, "batch", False)]


def _serve(core: WorkerCore, seqs: range, out: list[Any]) -> None:
    first = core.start()
    assert isinstance(first, Ready), first
    for seq in seqs:
        index = list(range(seq * BATCH, (seq + 1) * BATCH))
        reply = core.handle(Task(0, seq, index, first_sample=seq * BATCH))
        assert isinstance(reply, BatchDone), reply
        out.append(reply.payload)
    assert core.handle(Stop()) is STOP
    out.append(conveyor.get_worker_info())  # in this thread, outside the core: nobody
    core.close()


def _core(spec: WorkerSpec, dataset: Witness) -> WorkerCore:
    user = UserObjects(dataset, default_collate, None)
    return WorkerCore(spec, user, Reference(), MemoryStatus(), owns_process=False)


def _run_alone(spec: WorkerSpec) -> list[Any]:
    out: list[Any] = []
    worker = threading.Thread(target=_serve, args=(_core(spec, Witness()), range(2), out))
    worker.start()
    worker.join()
    return out


def _normalise(batch: Any) -> dict[str, list[Any]]:
    return {key: np.asarray(value).tolist() for key, value in batch.items()}


def test_two_cores_in_two_threads_never_see_each_others_state() -> None:
    dataset = Witness(threading.Barrier(2))  # one dataset object, as thread workers share
    outs: list[list[Any]] = [[], []]
    threads = [
        threading.Thread(target=_serve, args=(_core(spec, dataset), range(2), out))
        for spec, out in zip(SPECS, outs, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    alone = [_run_alone(spec) for spec in SPECS]

    for together, by_itself, spec in zip(outs, alone, SPECS, strict=True):
        *batches, info_after = together
        assert info_after is None  # the core left its thread as it found it
        assert [b["worker"].tolist() for b in batches] == [[spec.worker_id] * BATCH] * 2
        assert [b["seed"].tolist() for b in batches] == [[spec.base_seed + spec.worker_id] * 3] * 2
        # Its own draws, as if it had run alone (the other core, interleaved sample by
        # sample, reseeded its own generators meanwhile, never these).
        for key in ("mine", "py"):
            assert [_normalise(b)[key] for b in batches] == [
                _normalise(b)[key] for b in by_itself[:-1]
            ]
        resources = {value for b in batches for value in b["resource"].tolist()}
        assert len(resources) == 1  # one per_worker resource per core, reused
    mine = {outs[0][0]["resource"].tolist()[0], outs[1][0]["resource"].tolist()[0]}
    assert len(mine) == 2  # ... and not the other core's

    # Collate's flag is per core: the first leaves tensors to the main process (NumPy
    # leaves), the second makes them, where torch is there to make them.
    assert type(outs[0][0]["vector"]) is np.ndarray
    if "torch" in sys.modules:
        assert type(outs[1][0]["vector"]).__name__ == "Tensor"


def test_reseed_draws_depend_on_the_position_not_on_the_core() -> None:
    """``reseed="sample"``: worker 0 and worker 1 draw the same for the same sample."""
    spec = SPECS[0]
    other = _spec(1, spec.base_seed, "sample", True)
    first, second = _run_alone(spec), _run_alone(other)
    assert [_normalise(b)["mine"] for b in first[:-1]] == [
        _normalise(b)["mine"] for b in second[:-1]
    ]


def test_a_core_outside_a_worker_leaves_get_worker_info_to_the_main_process() -> None:
    assert conveyor.get_worker_info() is None
    core = _core(SPECS[0], Witness())
    assert isinstance(core.start(), Ready)
    assert conveyor.get_worker_info() is None  # start() left the caller's scope alone
    reply = core.handle(Task(0, 0, [0, 1, 2]))
    assert isinstance(reply, BatchDone)
    assert conveyor.get_worker_info() is None
    core.close()


@pytest.mark.torch
def test_torchs_get_worker_info_answers_for_each_core() -> None:
    torch = pytest.importorskip("torch")

    class AsksTorch(Witness):
        def __getitem__(self, index: int) -> dict[str, Any]:
            info = torch.utils.data.get_worker_info()
            sample = super().__getitem__(index)
            sample["torch_id"], sample["method"] = info.id, info.worker_method
            return sample

    outs: list[list[Any]] = [[], []]
    dataset = AsksTorch(threading.Barrier(2))
    threads = [
        threading.Thread(target=_serve, args=(_core(spec, dataset), range(2), out))
        for spec, out in zip(SPECS, outs, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for spec, out in zip(SPECS, outs, strict=True):
        for batch in out[:-1]:
            assert batch["torch_id"].tolist() == [spec.worker_id] * BATCH
            assert batch["method"] == ["thread"] * BATCH
    assert torch.utils.data.get_worker_info() is None  # this thread is no worker
