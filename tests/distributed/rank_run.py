"""One rank of a data-parallel run, for tests/distributed/test_elastic_ranks.py.

``python rank_run.py before|after OUT CASES`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT`` in the environment; a world of one starts no process group at all).

* ``before``: for each case, train ``steps`` steps of epoch 1 (each step takes one batch;
  gloo all-reduces a number, as a training step would), write the state and what this
  rank delivered, then say so on fd ``READY_FD`` (its workers' pids with it) and wait to
  be killed (the test SIGKILLs every rank, its workers alive).
* ``after``: for each case, load the state (rank 0's, the last rank's, or all merged),
  finish that epoch, then run the next one, and run the next one as a fresh loader of
  this world would (uninterrupted), writing what each delivered.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from conveyor import DataLoader, DistributedSampler, get_worker_info, merge_states


class Draws:
    """Sample ``i`` is ``(i, a random draw)``: what an augmentation sees. It draws from
    the worker's own generator (``get_worker_info().rng``, which thread workers need),
    else from NumPy's."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, float]:
        import numpy as np

        info = get_worker_info()
        if info is not None and info.rng is not None:
            return (i, float(info.rng.numpy_generator.random()))
        return (i, float(np.random.rand()))


def loader(case: dict[str, Any], world: int, rank: int, batch_size: int) -> DataLoader:
    dataset = Draws(case["n"])
    kind = torch.utils.data.DistributedSampler if case["torch_sampler"] else DistributedSampler
    # conveyor's sampler finds the world itself; on one process with no process group
    # it is a world of one.
    ranks = {} if kind is DistributedSampler else {"num_replicas": world, "rank": rank}
    sampler = kind(dataset, shuffle=case["shuffle"], seed=5, drop_last=case["drop_last"], **ranks)
    sampler.set_epoch(1)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **case["options"])


def step(batch: Any) -> list[tuple[int, float]]:
    """A training step: every rank takes part in a collective, as DDP's all-reduce."""
    if dist.is_initialized():
        dist.all_reduce(torch.ones(1))
    return list(zip(batch[0].tolist(), batch[1].tolist(), strict=True))


def before(out: Path, cases: list[dict[str, Any]], world: int, rank: int) -> None:
    alive: list[Any] = []
    pids: list[int] = []
    for i, case in enumerate(cases):
        torch.manual_seed(0)  # every rank draws the same base seed, as a seeded run does
        train = loader(case, world, rank, case["batch_size"])
        it = iter(train)
        seen = [s for _ in range(case["steps"]) for s in step(next(it))]
        (out / f"{i}.state.{rank}.json").write_text(json.dumps(train.state_dict()))
        (out / f"{i}.before.{rank}.json").write_text(json.dumps(seen))
        pids += [w.pid for w in getattr(it, "_workers", []) if getattr(w, "pid", None)]
        alive.append((train, it))  # killed mid-epoch, its workers running
    if dist.is_initialized():
        dist.barrier()
    os.write(int(os.environ["READY_FD"]), json.dumps(pids).encode() + b"\n")
    threading.Event().wait()  # until SIGKILL


def _chosen(states: list[dict[str, Any]], which: str) -> dict[str, Any]:
    """What the new run loads: one rank's state (Lightning's and accelerate's way) or
    every rank's, merged."""
    if which == "merged":
        return merge_states(states)
    return states[-1] if which == "last" else states[0]


def after(out: Path, cases: list[dict[str, Any]], world: int, rank: int) -> None:
    for i, case in enumerate(cases):
        old = case["old_world"]
        states = [json.loads((out / f"{i}.state.{r}.json").read_text()) for r in range(old)]
        state = _chosen(states, case["state_of"])
        resumed = loader(case, world, rank, case["new_batch_size"])
        resumed.batch_sampler.sampler.set_epoch(0)  # as Lightning leaves it: the state wins
        resumed.load_state_dict(state)
        rest = [s for batch in resumed for s in step(batch)]
        resumed.batch_sampler.sampler.set_epoch(2)
        following = [s[0] for batch in resumed for s in step(batch)]
        fresh = loader(case, world, rank, case["new_batch_size"])
        fresh.batch_sampler.sampler.set_epoch(2)
        expected = [s[0] for batch in fresh for s in step(batch)]
        report = {"rest": rest, "next": following, "uninterrupted_next": expected}
        (out / f"{i}.after.{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    phase, out, cases = sys.argv[1], Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text())
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    (before if phase == "before" else after)(out, cases, world, rank)
    if dist.is_initialized():
        dist.destroy_process_group()
