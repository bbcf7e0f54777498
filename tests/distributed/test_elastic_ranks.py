"""Resuming on another number of ranks, with real ranks: one process each, gloo on
127.0.0.1, every rank SIGKILLed (its workers running) after the checkpoint, then a new
world of another size loads the checkpoint and finishes the epoch. Over both runs every
sample of the epoch is delivered exactly once (torch's padding aside), and the next
epoch is, rank for rank, an uninterrupted run's on the new world.

The same accounting without processes, for many more cases: tests/resume/test_elastic.py.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers.leaks import wait_gone

pytest.importorskip("torch", reason="ranks are torch.distributed processes (gloo)")
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("rank_run.py")
ROOT = Path(__file__).resolve().parents[2]
N = 61


def _cases(old: tuple[int, int], new: tuple[int, int]) -> list[dict[str, Any]]:
    """Every worker kind, shuffle and drop_last; states alternately rank 0's, the last
    rank's and all ranks' merged; torch's own sampler in a few."""
    workers = [{}, {"num_workers": 2}, {"num_workers": 2, "worker_method": "thread"}]
    cases = []
    for i, (options, shuffle, drop_last) in enumerate(
        itertools.product(workers, [True, False], [False, True])
    ):
        cases.append({
            "n": N, "old_world": old[0], "batch_size": old[1], "new_batch_size": new[1],
            "steps": 2, "shuffle": shuffle, "drop_last": drop_last,
            "options": {**options, "reseed": "sample"},
            "state_of": ("first", "last", "merged")[i % 3],
            "torch_sampler": i % 4 == 3 and new[0] > 1,
        })  # fmt: skip
    return cases


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(phase: str, world: int, out: Path, cases: Path, ready: int | None) -> list[Any]:
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ, "PYTHONPATH": str(ROOT), "RANK": str(rank),
            "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "PYTHONWARNINGS": "ignore",
        }  # fmt: skip
        if ready is not None:
            env["READY_FD"] = str(ready)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(SCRIPT), phase, str(out), str(cases)],
                env=env,
                pass_fds=(ready,) if ready is not None else (),
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def _train_then_kill(world: int, out: Path, cases: Path) -> None:
    """The old run: every rank checkpoints, then is SIGKILLed with its workers running;
    the workers die with it."""
    read, write = os.pipe()
    procs = _launch("before", world, out, cases, write)
    os.close(write)
    workers: list[psutil.Process] = []
    with os.fdopen(read) as lines:
        for _ in range(world):
            line = lines.readline()  # blocks until a rank has checkpointed (or all died)
            if not line:
                errors = [p.communicate(timeout=60)[1][-2000:] for p in procs]
                raise AssertionError(f"a rank failed before its checkpoint: {errors}")
            workers += [psutil.Process(pid) for pid in json.loads(line)]
    assert workers, "the old run should be killed with workers running"
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
    for proc in procs:
        proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
    assert not wait_gone(workers, timeout=10), "workers outlived their killed rank"


def _resume(world: int, out: Path, cases: Path) -> None:
    procs = _launch("after", world, out, cases, None)
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]


def _reference_draws(case: dict[str, Any]) -> dict[int, float]:
    """Each sample's draw in an uninterrupted run on one rank with the same kind of
    workers (reseed="sample": by the sample's place in the epoch, whatever the world)."""
    import torch

    from .rank_run import loader

    torch.manual_seed(0)
    one = loader(case, 1, 0, 4)
    return {int(i): float(d) for batch in one for i, d in zip(*batch, strict=True)}


@pytest.mark.parametrize(
    ("old", "new"),
    [((4, 4), (2, 4)), ((2, 4), (3, 3)), ((3, 5), (1, 5))],
    ids=["4x4 to 2x4", "2x4 to 3x3", "3x5 to 1 (no process group)"],
)
def test_a_killed_run_resumes_on_another_number_of_ranks(
    old: tuple[int, int], new: tuple[int, int], tmp_path: Path
) -> None:
    cases = _cases(old, new)
    listed = tmp_path / "cases.json"
    listed.write_text(json.dumps(cases))
    _train_then_kill(old[0], tmp_path, listed)
    _resume(new[0], tmp_path, listed)
    for i, case in enumerate(cases):
        before = [
            json.loads((tmp_path / f"{i}.before.{r}.json").read_text()) for r in range(old[0])
        ]
        after = [json.loads((tmp_path / f"{i}.after.{r}.json").read_text()) for r in range(new[0])]
        delivered = [(int(s), d) for part in before for s, d in part]
        delivered += [(int(s), d) for part in after for s, d in part["rest"]]
        seen = collections.Counter(s for s, _ in delivered)
        missing = [s for s in range(N) if seen[s] == 0]
        repeats = sum(c - 1 for c in seen.values() if c > 1)
        where = f"case {i}: {case}"
        if case["drop_last"]:
            assert repeats == 0 and len(missing) <= new[0] - 1, where
        else:
            assert not missing and repeats <= new[0] - 1, where
        for part in after:  # the next epoch: as if this world had run from the start
            assert part["next"] == part["uninterrupted_next"], where
        draws = _reference_draws(case)  # padding (a repeat) is drawn as a place of its own
        other = [(s, d) for s, d in delivered if draws[s] != d]
        assert len(other) <= repeats and {s for s, _ in other} <= set(seen), (where, other)
