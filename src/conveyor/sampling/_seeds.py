"""The seeds a loader hands to its workers, drawn and derived as torch does.

A loader's iterator draws one base seed (:func:`draw_base_seed`, torch's own draw from
torch's RNG, or NumPy's); each worker's seeds for ``random``, torch and NumPy's legacy
global RNG follow from it and the worker's id by torch's arithmetic
(:func:`worker_seeds`), which needs neither torch nor a random draw: a worker that
defers torch computes them too. ``conveyor.sampling`` re-exports every name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conveyor.sampling._rng_backends import draw_seed, resolve_generator

__all__ = ["WorkerSeeds", "draw_base_seed", "worker_seeds"]


def draw_base_seed(generator: Any = None) -> int:
    """Draw a loader iterator's base seed, a non-negative 63-bit int.

    Under torch (``generator`` None or a ``torch.Generator``) this is torch's
    own draw, consuming the same RNG state as ``torch.utils.data.DataLoader``.
    Otherwise NumPy draws it from ``generator`` (a ``numpy.random.Generator``;
    an int seeds a new one on every call) or, for None, from fresh OS entropy.
    """
    return draw_seed(resolve_generator(generator))


@dataclass(frozen=True)
class WorkerSeeds:
    """The seeds one worker gives ``random``, torch and NumPy's legacy global RNG."""

    __module__ = "conveyor.sampling"  # where users import it from: its repr and pickles

    #: The seed of Python's ``random`` module.
    python: int
    #: The seed of torch's global generator.
    torch: int
    #: The four 32-bit words of NumPy's legacy global ``RandomState``'s seed.
    numpy: tuple[int, int, int, int]


_MASK32 = 0xFFFFFFFF


def _numpy_seed_material(base_seed: int, worker_id: int) -> tuple[int, int, int, int]:
    """Four 32-bit words, computed as torch's ``_generate_state`` computes them.

    The arithmetic is NumPy's ``SeedSequence`` hashing (pool size 4) applied to
    the entropy ``[worker_id, low 32 bits, high bits, 0]`` of the base seed.
    """
    hash_multiplier = 0x43B0D7E5

    def hash32(value: int) -> int:
        nonlocal hash_multiplier
        value = (value ^ hash_multiplier) & _MASK32
        hash_multiplier = (hash_multiplier * 0x931E8875) & _MASK32
        value = (value * hash_multiplier) & _MASK32
        return value ^ (value >> 16)

    def mix(x: int, y: int) -> int:
        value = (0xCA01F9DD * x - 0x4973F715 * y) & _MASK32
        return value ^ (value >> 16)

    entropy = (worker_id, base_seed & _MASK32, base_seed >> 32, 0)
    pool = [hash32(word) for word in entropy]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hash32(pool[src]))

    output_multiplier = 0x8B51F9DD
    words = []
    for word in pool:
        word = (word ^ output_multiplier) & _MASK32
        output_multiplier = (output_multiplier * 0x58F38DED) & _MASK32
        word = (word * output_multiplier) & _MASK32
        words.append(word ^ (word >> 16))
    return (words[0], words[1], words[2], words[3])


def worker_seeds(base_seed: int, worker_id: int) -> WorkerSeeds:
    """The seeds torch's worker loop uses for worker ``worker_id``.

    ``random.seed(s.python)``, ``torch.manual_seed(s.torch)`` and
    ``numpy.random.seed(s.numpy)`` reproduce torch's per-worker seeding.
    """
    seed = base_seed + worker_id
    return WorkerSeeds(python=seed, torch=seed, numpy=_numpy_seed_material(base_seed, worker_id))
