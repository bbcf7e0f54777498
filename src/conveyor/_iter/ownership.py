"""The iterator's workers, owned from the moment they exist, and stopped once, whole.

A pool made and not yet registered for closing is a pool nobody can stop: a Ctrl-C in
between left its processes running and its bare descriptors (a stack pipe, a
parent-watch pipe) open for the life of the interpreter. So the pool is made and its
closing tied to the iterator's life as one step (:meth:`Ownership.make`), and closing
runs whole (:meth:`Ownership.close`): a Ctrl-C meanwhile is held back until the step is
done, then raised (``_workers/interrupts.py``).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence

from .._workers.api import Pool, PoolFactory
from .._workers.interrupts import interrupts_deferred
from .._workers.spec import UserObjects, WorkerSpec
from ..collate import registrations as collate_registrations
from ..config import LoaderConfig
from .pin_ahead import PinAhead

__all__ = ["Ownership", "close_cut_short", "close_in_order"]

# Every pool's finalizer, until it has run (see close_cut_short).
_finalizers: set[weakref.finalize[[PinAhead | None, Pool], object]] = set()


class Ownership:
    """The pool an iterator owns, and the pinning thread that reads its memory."""

    def __init__(self, pin_ahead: PinAhead | None) -> None:
        self.pin_ahead = pin_ahead
        self._finalizer: weakref.finalize[[PinAhead | None, Pool], object] | None = None

    def make(
        self,
        owner: object,
        config: LoaderConfig,
        specs: Sequence[WorkerSpec],
        factory: PoolFactory | None = None,
    ) -> Pool:
        """Start the workers of ``specs`` (``factory``: the kind's pool, by default) and
        have them stopped when ``owner`` is closed or collected, as one step. A local
        kind makes its pool at once (each of its processes' starts is held from Ctrl-C
        anyway); a pool made on a cluster may wait for it, and Ctrl-C stays prompt
        there."""
        maps = collate_registrations()  # the collate_fn_map registrations, for the workers
        user = UserObjects(config.dataset, config.collate_fn, config.worker_init_fn, maps)
        if factory is None:
            factory = config.kind.pool(config)
        close_cut_short()
        with interrupts_deferred() if config.kind.local else contextlib.nullcontext():
            pool = factory(user, specs)
            self._finalizer = weakref.finalize(owner, close_in_order, self.pin_ahead, pool)
            _finalizers.add(self._finalizer)
        return pool

    def close(self) -> None:
        """Stop pinning, then the pool (if it was made); once. A Ctrl-C meanwhile waits
        until both are done."""
        with interrupts_deferred():
            if self._finalizer is not None:
                self._finalizer()


def close_in_order(pin_ahead: PinAhead | None, pool: Pool) -> None:
    """Stop pinning before the pool goes: a pin in flight reads a batch in its memory."""
    try:
        if pin_ahead is not None:
            pin_ahead.close()
    finally:
        pool.close()


def close_cut_short() -> None:
    """Close the pools whose iterator died without their finalizer running: a Ctrl-C
    that arrives as the iterator dies is raised at the finalizer's first bytecode, where
    Python prints it as ignored and the finalizer stays unrun (its workers would run on
    until the interpreter's exit, when it does run). Looked for as the next pool starts."""
    for finalizer in list(_finalizers):
        if not finalizer.alive:
            _finalizers.discard(finalizer)
        elif finalizer.peek() is None:  # its iterator is gone
            with interrupts_deferred():
                finalizer()
            _finalizers.discard(finalizer)
