"""The random streams an epoch's index order comes from, saved as plain data.

A sampler's order is a function of its generator's state when the epoch's
first index is drawn. Saving that state (and, for a sampler that draws from
torch's global RNG, the global state) lets a resumed loader draw the very same
order again, then skip what was delivered. States are JSON: a torch
generator's bytes as base64, a NumPy generator's ``bit_generator.state``.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import _torch
from ..sampling._rng_backends import UsesGenerator

__all__ = ["Streams", "replayed_draw"]


class Streams:
    """The generators behind one loader's index order (the loader's own included)."""

    def __init__(self, generator: Any, samplers: list[Any]) -> None:
        found: list[Any] = []
        self.uses_global = False
        candidates = [generator]
        for sampler in samplers:
            if sampler is None:
                continue
            if isinstance(sampler, UsesGenerator):
                candidates.append(sampler._rng)
                self.uses_global |= sampler._rng is None
            elif hasattr(sampler, "generator"):
                candidates.append(sampler.generator)
                self.uses_global |= sampler.generator is None
        for candidate in candidates:
            if _is_generator(candidate) and all(candidate is not g for g in found):
                found.append(candidate)
        self.generators = found
        self.uses_global = self.uses_global and _torch.load() is not None

    def capture(self) -> list[Any]:
        return [_state_of(g) for g in self.generators]

    def restore(self, states: list[Any]) -> None:
        if len(states) != len(self.generators):
            raise ValueError(
                f"expected the states of {len(self.generators)} generator(s), got {len(states)}"
            )
        for generator, state in zip(self.generators, states, strict=True):
            _set_state(generator, state)

    def capture_global(self) -> str | None:
        """torch's global RNG state, when a sampler draws from it (generator=None)."""
        torch = _torch.load()
        if not self.uses_global or torch is None:
            return None
        return _encode(torch.get_rng_state())

    @contextlib.contextmanager
    def global_state(self, saved: str | None) -> Iterator[None]:
        """Draw from torch's global RNG as it was when ``saved`` was taken.

        If the global RNG is elsewhere now, the caller's own state is given back
        afterwards (resuming must not change what the training loop draws). If it
        is already there (the user, or a dataset's own state, restored it), the
        draw advances it exactly as it did in the run the state was taken in.
        """
        torch = _torch.load()
        if saved is None or torch is None:
            yield
            return
        own = torch.get_rng_state()
        state = _decode(saved)
        if torch.equal(own, state):
            yield
            return
        torch.set_rng_state(state)
        try:
            yield
        finally:
            torch.set_rng_state(own)


def replayed_draw(streams: Streams, saved: str | None, draw: Any) -> tuple[Any, str | None]:
    """``draw()`` with torch's global RNG as ``saved`` holds it; returns what was drawn and
    the global state right after (what the epoch's first index draw then finds)."""
    torch = _torch.load()
    if saved is None or torch is None:
        return draw(), None
    with streams.global_state(saved):
        value = draw()
        after = _encode(torch.get_rng_state())
    return value, after


def _is_generator(obj: Any) -> bool:
    if isinstance(obj, np.random.Generator):
        return True
    torch = _torch.load()
    return torch is not None and isinstance(obj, torch.Generator)


def _state_of(generator: Any) -> Any:
    if isinstance(generator, np.random.Generator):
        return {"numpy": _plain(generator.bit_generator.state)}
    return {"torch": _encode(generator.get_state())}


def _set_state(generator: Any, state: Any) -> None:
    if isinstance(generator, np.random.Generator):
        if not isinstance(state, dict) or "numpy" not in state:
            raise ValueError(f"expected a NumPy generator's state, got {state!r:.80}")
        generator.bit_generator.state = state["numpy"]
        return
    if not isinstance(state, dict) or "torch" not in state:
        raise ValueError(f"expected a torch generator's state, got {state!r:.80}")
    generator.set_state(_decode(state["torch"]))


def _encode(tensor: Any) -> str:
    return base64.b64encode(tensor.numpy().tobytes()).decode("ascii")


def _decode(text: str) -> Any:
    torch = _torch.require()
    raw = np.frombuffer(base64.b64decode(text), dtype=np.uint8).copy()
    return torch.from_numpy(raw)


def _plain(value: Any) -> Any:
    """A bit generator's state with arrays as lists (JSON holds no arrays)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.integer):
        return int(value)
    return value
