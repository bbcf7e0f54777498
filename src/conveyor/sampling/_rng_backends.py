"""The two sources samplers draw random numbers from: torch's RNG, or NumPy.

With torch installed, a sampler whose ``generator`` is None or a ``torch.Generator``
draws from torch, calling it in exactly the order torch's samplers call it, so a seed
gives the same indices as torch. A ``numpy.random.Generator``, an int seed (one
``numpy.random.Generator`` from the moment it is assigned) or the absence of torch
draws from NumPy; ``None`` then means fresh OS entropy for every epoch.

The samplers (``conveyor.sampling``) only say what to draw; everything that knows which
backend draws is here. Indices come back as plain Python ints.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from conveyor import _torch

__all__ = [
    "UsesGenerator",
    "as_weights",
    "draw_seed",
    "multinomial",
    "permutation",
    "private_generator",
    "randint",
    "resolve_generator",
]

# None without torch. A worker that defers torch never samples.
torch: Any = _torch.load()


def resolve_generator(generator: Any) -> Any:
    """Check ``generator`` and return what to draw from.

    None stays None (torch's global RNG, or fresh NumPy entropy per epoch); a
    ``torch.Generator`` or ``numpy.random.Generator`` is used as is; an int is
    a NumPy seed.
    """
    if generator is None or isinstance(generator, np.random.Generator):
        return generator
    if torch is not None and isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, (int, np.integer)) and not isinstance(generator, bool):
        return np.random.default_rng(int(generator))
    expected = "a torch.Generator, " if torch is not None else ""
    raise TypeError(
        f"generator should be {expected}a numpy.random.Generator, an int seed or None, "
        f"but got {type(generator).__name__}: {generator!r}"
    )


class UsesGenerator:
    """Holds ``generator`` as the user gave it, plus the checked RNG to draw from."""

    _generator: Any
    _rng: Any

    @property
    def generator(self) -> Any:
        return self._generator

    @generator.setter
    def generator(self, value: Any) -> None:
        self._rng = resolve_generator(value)
        self._generator = value


def _torch_draws(rng: Any) -> bool:
    return torch is not None and not isinstance(rng, np.random.Generator)


def _numpy_rng(rng: Any) -> np.random.Generator:
    return rng if rng is not None else np.random.default_rng()


def private_generator() -> Any:
    """What a ``RandomSampler`` without a generator draws an epoch from: under torch, a
    ``torch.Generator`` seeded from torch's global RNG (torch's own draw), else fresh
    NumPy entropy."""
    if torch is None:
        return np.random.default_rng()
    seed = int(torch.empty((), dtype=torch.int64).random_().item())
    rng = torch.Generator()
    rng.manual_seed(seed)
    return rng


def draw_seed(rng: Any) -> int:
    """A non-negative 63-bit int drawn from ``rng`` (a resolved generator) as torch draws
    a loader's base seed, or from NumPy."""
    if _torch_draws(rng):
        return int(torch.empty((), dtype=torch.int64).random_(generator=rng).item())
    return int(_numpy_rng(rng).integers(0, 2**63, dtype=np.int64))


def as_weights(weights: Any) -> Any:
    """``weights`` as a float64 ``torch.Tensor`` under torch (as torch keeps them), else
    as a float64 NumPy array."""
    if torch is not None:
        return torch.as_tensor(weights, dtype=torch.double)
    return np.asarray(weights, dtype=np.float64)


def permutation(rng: Any, n: int) -> list[int]:
    if _torch_draws(rng):
        return cast(list[int], torch.randperm(n, generator=rng).tolist())
    return cast(list[int], _numpy_rng(rng).permutation(n).tolist())


def randint(rng: Any, high: int, size: int) -> list[int]:
    if _torch_draws(rng):
        drawn = torch.randint(high=high, size=(size,), dtype=torch.int64, generator=rng)
        return cast(list[int], drawn.tolist())
    if high <= 0:
        raise RuntimeError(f"cannot draw integers from an empty range [0, {high})")
    return cast(list[int], _numpy_rng(rng).integers(0, high, size=size).tolist())


def multinomial(rng: Any, weights: Any, num_samples: int, replacement: bool) -> list[int]:
    if _torch_draws(rng):
        drawn = torch.multinomial(weights, num_samples, replacement, generator=rng)
        return cast(list[int], drawn.tolist())
    w = np.asarray(weights, dtype=np.float64)
    n = w.shape[0]
    if not replacement and num_samples > n:
        raise RuntimeError(
            f"cannot sample {num_samples} > {n} categories without replacement (weights has {n})"
        )
    if n == 0:
        raise RuntimeError("cannot sample from empty weights")
    if not np.isfinite(w).all() or (w < 0).any():
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    total = w.sum()
    if not total > 0:
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    np_rng = _numpy_rng(rng)
    if replacement:
        return cast(list[int], np_rng.choice(n, size=num_samples, p=w / total).tolist())
    # Without replacement: the k largest w_i / E_i (E_i ~ Exp(1)) are a sequential
    # weighted draw without replacement; torch uses the same construction.
    keys = w / np_rng.exponential(size=n)
    return cast(list[int], np.argsort(-keys, kind="stable")[:num_samples].tolist())
