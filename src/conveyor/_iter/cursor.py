"""The epoch's index stream, drawn so that it can be drawn again.

A :class:`SamplerCursor` draws the sampler's outputs in order (the position
of an output is the task's ``seq``) and keeps what a resumed loader needs to
continue at any position ``k``:

* *count*: the sampler remembers nothing of its own. The state is ``k`` and
  the random streams as they were before the epoch's first draw; resuming
  re-draws the same order and skips ``k`` outputs, fetching nothing.
* *stateful*: the sampler or its iterator has ``state_dict()`` (torchdata's
  protocol, or a plain ``BatchSampler``, torch's or conveyor's, over such a sampler:
  opened as a ``BatchIterator``, which keeps that state). Its state is
  taken before each draw and kept until that output is delivered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..config import LoaderConfig
from ..sampling import BatchIterator
from ..sampling._defaults import open_index
from ..stateful import is_stateful, save_of
from .elastic import RankPart
from .rng import Streams
from .sharding import find
from .share import EpochShare

END: Any = object()  # what ``next`` returns once the sampler is exhausted


class SamplerCursor:
    def __init__(self, config: LoaderConfig) -> None:
        self._sampler = config.index_sampler
        self._auto_collation = config.auto_collation
        inner = getattr(config.batch_sampler, "sampler", None)
        sharding = find(config)
        # Ranks that shard the epoch: what a state says of the whole epoch (see .sharding).
        self.share = EpochShare(sharding) if sharding is not None else None
        source = sharding.order_source if sharding is not None else None
        self.streams = Streams(
            config.generator, [config.index_sampler, inner, config.sampler, source]
        )
        self._iter: Iterator[Any] = iter(())
        self._stateful: bool | None = False
        self.drawn = 0  # outputs drawn this epoch: the next output's seq
        self.samples_drawn = 0  # samples in them: the next sample's position
        self.last_first = 0  # the position of the last output's first sample
        self.rng_at_start: list[Any] = []
        self.global_at_start: str | None = None
        self._replay_global: str | None = None  # resumed: the first draw uses this
        self._before: dict[int, dict[str, Any]] = {}  # seq -> sampler states before it
        self._samples_before: dict[int, int] = {}
        self._taken = False  # the streams were saved for this epoch
        self._low = 0

    # --- an epoch ------------------------------------------------------------------
    #
    # The random streams are saved just before the epoch's first draw: by then the
    # loader has drawn its base seed (from the same generator perhaps), in every
    # layout, so a resumed loader draws its base seed, restores the streams and
    # draws the same order again, with or without workers.

    def start(self) -> None:
        """A fresh epoch."""
        self._open()
        self._taken = False
        if self.share is not None:
            self.share.fresh()

    def reopen(self, main: dict[str, Any]) -> None:
        """Begin again the epoch ``main`` was taken in; then :meth:`restore_streams`
        (once the base seed is drawn) and :meth:`advance`."""
        sampler_state = main.get("_index_sampler_state")
        if sampler_state is not None and is_stateful(self._sampler):
            self._sampler.load_state_dict(sampler_state)
        self._open()
        self._taken = True
        self.rng_at_start = list(main.get("rng") or [])
        self.global_at_start = self._replay_global = main.get("global_rng")

    def replay_first_draw(self, saved: str | None) -> None:
        """The epoch's first draw uses torch's global RNG as ``saved`` holds it."""
        self._replay_global = saved

    def restore_streams(self) -> None:
        if self.rng_at_start:  # a state torchdata wrote has none: they stay as they are
            self.streams.restore(self.rng_at_start)

    def deal_rest(self, part: RankPart, drawn: int, samples: int) -> None:
        """Resumed from ``part``, a state of a run that sharded the epoch over ranks (maybe
        another number of them): draw this rank's share of the rest of that epoch instead
        of the sampler's (after :meth:`restore_streams`: an order drawn from a generator
        is drawn again from where that epoch began). Its outputs take positions from
        ``drawn`` on (``samples``: the samples before them), where the state's rank was."""
        assert self.share is not None
        with self._first_draw():  # a sampler that draws from torch's global RNG
            self._iter = iter(self.share.resume(part, drawn, samples))
        self._stateful = False
        self.drawn, self.samples_drawn = drawn, samples

    def advance(self, main: dict[str, Any], drawn: int, samples: int | None) -> None:
        """Move past the ``drawn`` outputs already consumed: restore the sampler's own
        state where it has one (that state is at ``_sampler_iter_yielded``), and draw
        and drop the rest."""
        at = main.get("_sampler_iter_yielded")
        at = drawn if not isinstance(at, int) else min(at, drawn)
        iter_state = main.get("_sampler_iter_state")
        if iter_state is not None and is_stateful(self._iter):
            with self._first_draw():
                self._iter.load_state_dict(iter_state)  # type: ignore[attr-defined]
            self.drawn = at
        elif main.get("_index_sampler_state") is not None and is_stateful(self._sampler):
            self.drawn = at  # the sampler's own state put it there
        else:
            at = 0
        self.skip(drawn - at)
        if samples is not None:
            self.samples_drawn = samples

    def _open(self) -> None:
        self._iter = open_index(self._sampler)  # a batch sampler's state kept beside it
        self._stateful = None  # asked at the first draw (a batch sampler opens its own then)
        self.drawn = self.samples_drawn = 0
        self._before.clear()
        self._samples_before.clear()
        self._low = 0  # positions below this are forgotten
        self._replay_global = None

    def skip(self, count: int) -> None:
        """Draw ``count`` outputs and drop them (already delivered)."""
        for _ in range(count):
            if self.next() is END:
                return

    # --- drawing -------------------------------------------------------------------

    def next(self) -> Any:
        """The next output (its seq is ``drawn`` before the call), or ``END``."""
        seq = self.drawn
        if not self._taken:
            self._take_start()
        self._samples_before[seq] = self.last_first = self.samples_drawn
        if self._replay_global is None and self._stateful is False:  # the commonest
            value = next(self._iter, END)
        elif self._replay_global is None:
            value = self._draw(seq)
        else:
            with self._first_draw():
                value = self._draw(seq)
        if value is END:
            return END
        self.drawn += 1
        self.samples_drawn += len(value) if self._auto_collation else 1
        return value

    def _draw(self, seq: int) -> Any:
        if self._keeps():
            self._before[seq] = self._states()
        return next(self._iter, END)

    def _take_start(self) -> None:
        self.rng_at_start = self.streams.capture()
        self.global_at_start = self.streams.capture_global()
        self._taken = True
        if self.share is not None:
            self.share.first_draw()

    @contextlib.contextmanager
    def _first_draw(self) -> Iterator[None]:
        """A resumed sampler that draws from torch's global RNG draws its first output
        from the global state saved with the epoch (then the user's state is back)."""
        saved, self._replay_global = self._replay_global, None
        with self.streams.global_state(saved):
            yield

    # --- what a state holds ------------------------------------------------------------

    def state_at(self, seq: int) -> dict[str, Any]:
        """The main process's part of a state taken when outputs ``< seq`` are delivered."""
        if not self._taken:  # nothing drawn yet: as the first draw will find them
            self._take_start()
        state: dict[str, Any] = {
            "_sampler_iter_yielded": seq,
            "_index_sampler_state": None,
            "_sampler_iter_state": None,
            "rng": list(self.rng_at_start),
            "global_rng": self.global_at_start,
        }
        if self._keeps():
            before = self._before.get(seq)
            if before is None:  # not drawn yet: the states are the current ones
                before = self._states()
            state.update(before)
        return state

    def samples_before(self, seq: int) -> int:
        return self._samples_before.get(seq, self.samples_drawn)

    def places(self, seq: int) -> tuple[int, ...]:
        """Where output ``seq``'s samples sit in the whole epoch's order, for ranks that
        shard it (``reseed="sample"`` seeds by that: the same on any number of ranks)."""
        if self.share is None or not self._auto_collation:
            return ()
        first = self.samples_before(seq)
        return self.share.places(seq, first, self.samples_before(seq + 1) - first)

    def ranks_part(self, prefix: int, beyond: tuple[int, ...]) -> dict[str, Any] | None:
        """A state's ``ranks`` part (None when the loader does not shard over ranks), with
        outputs below ``prefix`` and at ``beyond`` delivered."""
        if self.share is None:
            return None
        at = self.samples_before
        positions = [j for seq in beyond for j in range(at(seq), at(seq + 1))]
        return self.share.part(at(prefix), positions)

    def forget_before(self, seq: int) -> None:
        """Outputs before ``seq`` are delivered: their saved states are not needed."""
        low, kept = self._low, self._samples_before
        while low < seq:  # positions are consecutive: one pop each, no scan
            kept.pop(low, None)
            self._before.pop(low, None)
            low += 1
        self._low = low

    def _keeps(self) -> bool:
        if self._stateful is None:
            self._stateful = self._keeps_state()
        return self._stateful

    def _keeps_state(self) -> bool:
        if isinstance(self._iter, BatchIterator):
            return self._iter.inner_stateful
        return is_stateful(self._iter) or is_stateful(self._sampler)

    def _states(self) -> dict[str, Any]:
        return {
            "_index_sampler_state": save_of(self._sampler),
            "_sampler_iter_state": save_of(self._iter),
        }
