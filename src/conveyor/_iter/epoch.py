"""Where an iterator's first epoch starts: the resume point, the base seed, the first draw.

Both iterators, in-process and with workers, start through one
:class:`EpochStart`, so a state taken by either resumes in either. A new
iterator starts an epoch afresh, resumes one mid-way (``load_state_dict`` of a
state taken during the epoch) or starts the epoch after one a state was taken
at the end of. The random streams are put where the run the state was taken in
had them: the base seed is drawn as torch draws it (consuming the same RNG), and
the sampler's first draw finds the generators, and torch's global RNG, as they
were then (see :mod:`.cursor` and :mod:`.rng`).
"""

from __future__ import annotations

import dataclasses
import pickle
import warnings
from collections.abc import Callable
from typing import Any

from .._task.dataset_state import WorkerState
from .._workers.spec import WorkerSpec
from ..config import LoaderConfig, LoaderHistory
from ..distributed import process_group
from ..errors import StateError
from ..sampling._seeds import draw_base_seed
from ..stateful import load_into
from . import messages
from .cursor import SamplerCursor
from .elastic import RankPart, check_fits, read_part
from .facts import Position
from .rng import replayed_draw
from .sharding import SAMPLES
from .state import ResumePoint


class EpochStart:
    def __init__(
        self,
        config: LoaderConfig,
        history: LoaderHistory,
        resume: ResumePoint | None,
        *,
        num_workers: int,
    ) -> None:
        """Checks that ``resume`` fits ``num_workers`` and gives the loader back its
        records (skipped samples, the epoch count)."""
        self.config = config
        if resume is not None:
            per_worker = config.state_per_worker
            resume.check_workers(num_workers, per_worker=per_worker, why=per_worker_why(config))
            if config.iterable:
                _check_same_ranks(resume, config)
            history.skipped[:] = resume.skipped
            if resume.epoch is not None:
                history.epochs_started = resume.epoch + (1 if resume.finished else 0)
        self.resume = resume
        self.finished = resume is not None and resume.finished  # the next epoch starts
        # Resumed mid-epoch: where the epoch goes on.
        self.mid = resume if resume is not None and not resume.finished else None
        self.cursor = SamplerCursor(config)
        self._first_global: str | None = None
        self.base_seed = 0  # drawn by draw_base_seed
        # Resumed mid-epoch from a run that sharded it over ranks: this rank's share of
        # the rest of that epoch, dealt afresh (the world may have changed since).
        self._rest_of: RankPart | None = None
        if self.mid is not None and self.mid.ranks is not None:
            self._rest_of = self._elastic(read_part(self.mid.ranks))
        elif self.finished and resume is not None and resume.ranks is not None:
            self._next_epoch_of(read_part(resume.ranks))
        if self._rest_of is not None and self.mid is not None:
            # What the old rank delivered beyond its prefix is in the part: the rest of
            # the epoch is dealt after the prefix.
            self.mid = dataclasses.replace(
                self.mid, beyond=frozenset(), samples=self.mid.samples or 0, replay=0,
                last_worker=-1,
            )  # fmt: skip

    def _next_epoch_of(self, part: RankPart) -> None:
        """Resumed after the epoch ``part`` ended: a distributed sampler not moved past
        that epoch yet (Lightning calls ``iter()`` before ``set_epoch()``) deals the next
        one, not an earlier epoch's order again."""
        share = self.cursor.share
        if share is None or share.sharding.deal.dealing != SAMPLES:
            return  # accelerate sets its samplers' epoch itself before iter()
        source = share.sharding.order_source
        ended = part.order.get("epoch")
        at = getattr(source, "epoch", None)
        if isinstance(ended, int) and isinstance(at, int) and at <= ended:
            source.set_epoch(ended + 1)

    def _elastic(self, part: RankPart) -> RankPart | None:
        """``part`` if the rest of its epoch is to be dealt to this rank; None to resume
        this rank's own position (a dataset with a state of its own, saved per worker,
        resumes only on the same rank of the same world)."""
        config, share = self.config, self.cursor.share
        what = type(getattr(config.batch_sampler, "sampler", None) or config.sampler).__name__
        check_fits(part, share.sharding if share is not None else None, what)
        assert share is not None
        if not config.dataset_keeps_state:
            return part
        deal, now = part.deal, share.sharding.deal
        if (deal.world_size, deal.rank, deal.batch_size) != (
            now.world_size, now.rank, now.batch_size,
        ):  # fmt: skip
            raise StateError(
                f"This state was taken by rank {deal.rank} of {deal.world_size} (batch_size "
                f"{deal.batch_size}) and is loaded into rank {now.rank} of {now.world_size} "
                f"(batch_size {now.batch_size}), but the dataset "
                f"{type(config.dataset).__name__} keeps a state of its own, saved per worker of "
                "each rank: conveyor cannot deal it to other ranks. Resume on the same ranks "
                "with the same batch size, or let the dataset be a map-style one without a state."
            )
        if callable(set_epoch := getattr(share.sharding.order_source, "set_epoch", None)):
            set_epoch(part.order.get("epoch", 0))  # the state's epoch wins over the sampler's
        return None

    def position(self, num_workers: int) -> Position:
        """Where the epoch's dispatch begins: resumed, at the first position not handed
        out, and round-robin where it was when the worker count is the same."""
        mid = self.mid
        if mid is None:
            return Position()
        first_worker = mid.last_worker + 1 if mid.num_workers == num_workers else 0
        return Position(mid.delivered, first_worker, mid.beyond)

    def draw_base_seed(self, *, in_process: bool) -> int:
        """Draw the base seed as torch draws it and put the random streams where the
        epoch needs them.

        torch's in-process iterator opens the sampler, then draws the seed
        (``in_process``: the cursor opens here, at the resume point; and a dataset
        resumed after its epoch ended gets its saved state back). Its multi-process
        iterator opens the sampler once, draws the seed, and opens it again per epoch
        (then :meth:`open_cursor`): samplers that draw eagerly in ``__iter__`` consume
        the RNG in that order. After a state taken at an epoch's end, the next epoch
        draws as it would have: from the generators as the epoch left them, and
        torch's global RNG as it was then; persistent workers drew no new base seed
        for that epoch, so theirs is kept.
        """
        config, resume, streams = self.config, self.resume, self.cursor.streams
        persistent = config.persistent_workers and not in_process
        rng_after = resume.rng_after if resume is not None and self.finished else None
        saved_global = resume.global_after if resume is not None and self.finished else None
        if rng_after and not persistent:
            streams.restore(rng_after)
        if in_process:
            if resume is not None and self.finished and resume.workers:
                load_into(config.dataset, resume.workers[0].dataset_state)
            self._open()
        else:
            iter(config.index_sampler)
        if persistent:
            seed, self._first_global = draw_base_seed(config.generator), saved_global
        else:
            seed, self._first_global = replayed_draw(
                streams, saved_global, lambda: draw_base_seed(config.generator)
            )
        if rng_after and persistent:
            streams.restore(rng_after)
        if in_process:
            self._place()
        keeps_seed = self.mid is not None or (self.finished and persistent)
        if keeps_seed and resume is not None and resume.base_seed is not None:
            self.base_seed = resume.base_seed
        else:
            self.base_seed = int(seed)
        return self.base_seed

    def open_cursor(self) -> None:
        """Open the first epoch's sampler, after the base seed (workers), and move it
        past what was handed out."""
        self._open()
        self._place()
        self.skip_handed_out()

    def skip_handed_out(self) -> None:
        """Resumed mid-epoch: draw (or restore) the sampler past the positions handed
        out; indices only, no sample is fetched."""
        mid = self.mid
        if mid is not None and self._rest_of is None:
            self.cursor.advance(mid.main, mid.delivered, mid.samples)

    def replay(self, fetch: Callable[[], object]) -> int:
        """Resumed mid-epoch: ``fetch()`` again, and drop, the batches handed out after
        the state's snapshot (the datasets' states are the snapshot's); how many came."""
        fetched = 0
        for _ in range(self.mid.replay if self.mid is not None else 0):
            try:
                fetch()
            except StopIteration:
                break
            fetched += 1
        return fetched

    def _open(self) -> None:
        if self.mid is not None:
            self.cursor.reopen(self.mid.main)
        else:
            self.cursor.start()

    def _place(self) -> None:
        if self.mid is not None:
            self.cursor.restore_streams()
            if self._rest_of is not None:
                self.cursor.deal_rest(self._rest_of, self.mid.delivered, self.mid.samples or 0)
        else:
            self.cursor.replay_first_draw(self._first_global)

    def worker_specs(self, **news: Any) -> list[WorkerSpec]:
        """What each worker starts with (after :meth:`draw_base_seed`): the loader's
        settings, the base seed and, resumed, its part of the state (persistent workers
        after a finished epoch too: they then begin a new epoch, as they would have in
        the run the state was taken in); ``news``: what the epoch starts with (.epoch_news)."""
        config, resume = self.config, self.resume
        per_worker = config.state_per_worker
        restored: list[bytes | None] | None = None
        # After a finished epoch, new workers start from the dataset as it is.
        keeps = not self.finished or config.persistent_workers
        if per_worker and keeps and resume is not None and resume.workers:
            restored = [_pickled(s) if s.holds_state or s.ended else None for s in resume.workers]
        return [
            WorkerSpec.for_worker(
                config,
                i,
                self.base_seed,
                resume_state=restored[i] if restored is not None else None,
                # Restored as the last epoch ended: the next epoch is a new one.
                new_epoch_first=self.finished and restored is not None,
                **news,
            )
            for i in range(config.num_workers)
        ]


def warn_past_length(
    config: LoaderConfig, history: LoaderHistory, yielded: int, stacklevel: int
) -> None:
    """torch's warning when an iterable dataset yields more batches than its ``len()``
    said (``yielded``: batches handed out this epoch, as the state counts them)."""
    length = history.iterable_len
    if length is not None and yielded > length:
        text = messages.iterable_length(config.dataset, length, yielded, config.num_workers > 0)
        warnings.warn(text, UserWarning, stacklevel=stacklevel + 1)


def _check_same_ranks(resume: ResumePoint, config: LoaderConfig) -> None:
    """An iterable dataset's state resumes only on the rank of the world it was taken on."""
    then, now = resume.world or (1, 0), process_group() or (1, 0)
    if then == now:
        return
    raise StateError(
        f"This state was taken on rank {then[1]} of {then[0]} and is loaded on rank {now[1]} of "
        f"{now[0]}. The iterable dataset {type(config.dataset).__name__} splits itself among "
        "ranks and workers in its own code, and its state (saved per worker) is that rank's "
        "share: conveyor cannot deal it to other ranks. Resume on the same ranks; or, to resume "
        "on another number of them, make the dataset map-style with a DistributedSampler (which "
        "conveyor re-deals exactly), or have its state_dict() record where the whole epoch "
        "stands and its load_state_dict() skip there for the new rank's share."
    )


def per_worker_why(config: LoaderConfig) -> str:
    """Why a state must resume with the worker count it was taken with."""
    if config.iterable:
        return "An iterable-style dataset is split among workers by its own code."
    return (
        f"The dataset {type(config.dataset).__name__} has state_dict()/load_state_dict(), "
        "so its state is saved per worker."
    )


def _pickled(state: WorkerState) -> bytes:
    return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
