"""The round trip every resume test makes.

Run a loader uninterrupted for ``epochs`` epochs; run an identical one to step
``k``, take its state through ``json.dumps``/``json.loads``, build a new loader
(maybe with another worker count or start method), load the state and run to
the end of the same epochs. The two runs must hand out the same batches: in the
same order with ``in_order=True``, each exactly once per epoch otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from conveyor import DataLoader

from .datasets import plain

Make = Callable[[], DataLoader]


def epochs_of(make: Make, epochs: int) -> list[list[Any]]:
    loader = make()
    return [[plain(b) for b in loader] for _ in range(epochs)]


def resumed_run(make: Make, make_resumed: Make, k: int, epochs: int) -> list[list[Any]]:
    """Step ``k`` counts batches of the first epoch; ``k`` past its last batch means the
    state is taken after the epoch ended (its StopIteration seen)."""
    loader = make()
    it = iter(loader)
    first = []
    for _ in range(k):
        try:
            first.append(plain(next(it)))
        except StopIteration:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    ended = len(first) < k
    del it, loader
    resumed = make_resumed()
    resumed.load_state_dict(state)
    runs = [first] if ended else [first + [plain(b) for b in resumed]]
    runs += [[plain(b) for b in resumed] for _ in range(epochs - len(runs))]
    return runs


def assert_same(expected: list[list[Any]], got: list[list[Any]], in_order: bool = True) -> None:
    assert len(got) == len(expected)
    for epoch, (want, have) in enumerate(zip(expected, got, strict=True)):
        if in_order:
            assert have == want, f"epoch {epoch} differs"
        else:
            assert sorted(map(repr, have)) == sorted(map(repr, want)), f"epoch {epoch} differs"
