"""A loader's state as plain data: the layout ``state_dict()`` writes and ``load_state_dict``
reads.

The layout is torchdata's ``StatefulDataLoader``'s, so code (and tests) that
look inside a state keep working; conveyor's own part sits beside it under
``"conveyor"``. With workers::

    {"_snapshot": {"_snapshot_step": s, "_last_yielded_worker_id": w,
                   "_main_snapshot": {sampler states, "_num_workers", "_base_seed", ...},
                   "_worker_snapshots": {"worker_<i>": {"dataset_state", "fetcher_state"}}},
     "_steps_since_snapshot": n, "_iterator_finished": bool, "conveyor": {...}}

Without workers the sampler and dataset keys sit at the top level
(``"dataset_state" in state`` tells the layouts apart). :func:`write` lays a state
out; reading one back, every key checked, is ``parse_state.parse``'s, into one
:class:`ResumePoint` whichever layout (or torchdata) wrote it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from .._task.dataset_calls import DatasetCall
from .._task.dataset_state import WorkerState
from ..errors import WorkerCountError
from ..records import SkippedSample
from .elastic import RANKS

VERSION = 1
CONVEYOR = "conveyor"
SNAPSHOT = "_snapshot"
MAIN = "_main_snapshot"
WORKERS = "_worker_snapshots"
FINISHED = "_iterator_finished"
# Under "conveyor": the dataset's calls the epoch's workers got (set_epoch...), oldest
# first, each {"name", "args", "kwargs"}. An optional key (version 1 still): a state
# without it resumes with none, and a conveyor that does not know it ignores it.
CALLS = "calls"
SAMPLER_KEYS = ("_sampler_iter_yielded", "_index_sampler_state", "_sampler_iter_state")


def worker_key(worker_id: int) -> str:
    return f"worker_{worker_id}"


@dataclass(frozen=True)
class ResumePoint:
    """Where to continue, whichever layout it was read from."""

    num_workers: int  # the worker count the state was taken with
    finished: bool  # taken after the epoch ended: the next iterator starts a new one
    epoch: int | None  # None: a state torchdata wrote (the loader keeps counting its own)
    delivered: int  # sampler outputs whose batches were handed out (a prefix, in order)
    beyond: frozenset[int]  # in_order=False: outputs handed out past that prefix
    samples: int | None  # samples in the delivered prefix (positions for reseed="sample")
    yielded: int  # batches handed out this epoch at the snapshot
    replay: int  # batches to fetch again and drop before the first one handed out
    main: dict[str, Any]  # sampler states and random streams at the snapshot
    base_seed: int | None
    workers: tuple[WorkerState, ...]  # one per worker; () without workers
    last_worker: int
    skipped: tuple[SkippedSample, ...] = ()
    rng_after: list[Any] | None = None  # generator states when the epoch ended
    global_after: str | None = None  # torch's global RNG when the state was taken (ended)
    raw: dict[str, Any] = field(default_factory=dict)  # the state as given
    ranks: dict[str, Any] | None = None  # where the whole epoch stands (see .elastic)
    world: tuple[int, int] | None = None  # (world size, rank) of the process group, if any
    calls: tuple[DatasetCall, ...] = ()  # the dataset's set_epoch... as the epoch had it

    @property
    def holds_worker_state(self) -> bool:
        return any(w.holds_state for w in self.workers)

    def check_workers(self, num_workers: int, *, per_worker: bool, why: str) -> None:
        """Per-worker state resumes only with the worker count it was taken with."""
        if per_worker and num_workers != self.num_workers:
            raise WorkerCountError(
                f"This state was taken with num_workers={self.num_workers} and is loaded into "
                f"a loader with num_workers={num_workers}. {why} Each worker's part of the "
                "state belongs to that worker, so it can only resume with the same count. "
                f"Fix: use num_workers={self.num_workers} for this resume (you can change it "
                "at the next epoch boundary), or make the dataset a map-style one without a "
                "state of its own, which resumes at any worker count."
            )


# --- writing ------------------------------------------------------------------------


@dataclass(frozen=True)
class Written:
    """What the iterators know, to write as a state."""

    num_workers: int
    epoch: int
    finished: bool
    main: dict[str, Any]  # the cursor's state_at(): sampler states, rng
    samples: int
    beyond: tuple[int, ...]
    yielded: int
    snapshot_step: int
    steps_since: int
    base_seed: int
    workers: tuple[WorkerState, ...]  # () without workers
    inline: WorkerState | None  # without workers: the dataset's own part
    last_worker: int
    skipped: tuple[SkippedSample, ...]
    rng_after: list[Any] | None
    global_after: str | None
    dataset_len: int | None
    iterable_len: int | None
    reseed: str
    ranks: dict[str, Any] | None = None  # the loader shards the epoch over ranks
    world: tuple[int, int] | None = None  # torch.distributed's (world size, rank)
    calls: tuple[DatasetCall, ...] = ()  # the calls the epoch's workers got (set_epoch...)


def write(w: Written) -> dict[str, Any]:
    sampler = {key: copy.deepcopy(w.main.get(key)) for key in SAMPLER_KEYS}
    own = {
        "version": VERSION,
        "epoch": w.epoch,
        "samples": w.samples,
        "delivered_beyond": sorted(w.beyond),
        "rng": copy.deepcopy(w.main.get("rng", [])),
        "global_rng": w.main.get("global_rng"),
        "rng_after": w.rng_after,
        "global_after": w.global_after,
        "base_seed": w.base_seed,
        "skipped": [_skip_to_dict(s) for s in w.skipped],
        "dataset_len": w.dataset_len,
        "reseed": w.reseed,
        "num_workers": w.num_workers,
        "yielded": w.yielded,
    }
    if w.ranks is not None:
        own[RANKS] = w.ranks
    if w.world is not None:
        own["world"] = list(w.world)
    if w.calls:  # (absent: none, as in a state written before conveyor kept them)
        own[CALLS] = [_call_to_dict(c) for c in w.calls]
    if w.inline is not None:
        return {
            **sampler,
            "_num_yielded": w.yielded,
            "_IterableDataset_len_called": w.iterable_len,
            "_shared_seed": None,
            **w.inline.to_dict(),
            FINISHED: w.finished,
            CONVEYOR: own,
        }
    main = {
        "_num_workers": w.num_workers,
        **sampler,
        "_IterableDataset_len_called": w.iterable_len,
        "_shared_seed": None,
        "_base_seed": w.base_seed,
    }
    return {
        SNAPSHOT: {
            "_snapshot_step": w.snapshot_step,
            "_last_yielded_worker_id": w.last_worker,
            "_main_snapshot": main,
            WORKERS: {worker_key(i): s.to_dict() for i, s in enumerate(w.workers)},
        },
        "_steps_since_snapshot": w.steps_since,
        FINISHED: w.finished,
        CONVEYOR: own,
    }


def _call_to_dict(call: DatasetCall) -> dict[str, Any]:
    return {
        "name": call.name,
        "args": copy.deepcopy(list(call.args)),
        "kwargs": copy.deepcopy(dict(call.kwargs)),
    }


def _skip_to_dict(s: SkippedSample) -> dict[str, Any]:
    return {
        "index": s.index,
        "epoch": s.epoch,
        "worker_id": s.worker_id,
        "stage": s.stage,
        "exception_type": s.exception_type,
        "message": s.message,
    }
