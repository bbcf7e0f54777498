"""What belongs to one worker core rather than to its process.

A process worker runs one core per process; thread workers run several cores in one
process (the training process, or a worker process with ``threads_per_worker``); the
fake pool of the loop's tests runs several cores in the test's own thread, one task at
a time. So nothing a core changes may live in a module global: its worker info,
whether collate leaves tensors to the main process, its random generators, the
``per_worker`` resources it opened, whether its dataset asked ``get_worker_info()``.
They live in a :class:`WorkerScope`, which a core makes current while it runs (a
``ContextVar``: each thread has its own value, and a core entering it for one task
leaves it as it found it).
"""

from __future__ import annotations

import contextvars
import random
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "GLOBAL_GENERATORS",
    "ModuleStandIns",
    "WorkerInfo",
    "WorkerRng",
    "WorkerScope",
    "current",
    "entered",
]


class WorkerRng:
    """A worker's own generators, as torch 2.13's thread workers name them:
    ``random_generator`` (``random.Random``), ``numpy_generator``
    (``numpy.random.Generator``) and ``torch_generator`` (``torch.Generator``).

    Seeded as the process-wide generators of a process worker are, and reseeded with
    them (``reseed``), so code that draws from them gets the same values whichever
    kind of worker runs it, and several thread workers never share a generator.

    Each generator is made on first use, seeded with the latest seeds: seeding costs
    (a NumPy generator's about 30 µs, once per sample with ``reseed="sample"``) only
    where the dataset uses it, and torch is never imported for it otherwise."""

    def __init__(self) -> None:
        self._seeds: tuple[int, Any, int] = (0, 0, 0)  # python, numpy, torch
        self._random: random.Random | None = None
        self._numpy: np.random.Generator | None = None
        self._torch: Any = None

    def seed_each(self, python: int, numpy_seed: Any, torch_seed: int) -> None:
        """Seed each generator as torch seeds a worker's: its own seed for each."""
        self._seeds = (python, numpy_seed, torch_seed)
        if self._random is not None:
            self._random.seed(python)
        if self._numpy is not None:
            self._numpy.bit_generator.state = np.random.PCG64(numpy_seed).state
        if self._torch is not None:
            self._torch.manual_seed(torch_seed)

    def seed(self, seed: int) -> None:
        """Seed all three from one seed (``reseed``)."""
        self.seed_each(seed, seed, seed)

    @property
    def random_generator(self) -> random.Random:
        """This worker's ``random.Random``."""
        if self._random is None:
            self._random = random.Random(self._seeds[0])
        return self._random

    @property
    def numpy_generator(self) -> np.random.Generator:
        """This worker's ``numpy.random.Generator``."""
        if self._numpy is None:
            self._numpy = np.random.Generator(np.random.PCG64(self._seeds[1]))
        return self._numpy

    @property
    def torch_generator(self) -> Any:
        """This worker's ``torch.Generator`` (on the CPU)."""
        if self._torch is None:
            import torch

            generator = torch.Generator()
            generator.manual_seed(self._seeds[2])
            self._torch = generator
        return self._torch


@dataclass(frozen=True)
class WorkerInfo:
    """Describes the worker running the current code (torch 2.13's fields).

    ``id`` is this worker's (0 to ``num_workers - 1``), ``seed`` its seed (the
    loader's base seed plus ``id``, as torch's). ``dataset`` is this worker's own copy
    of the dataset: under ``spawn`` and ``forkserver`` it is a different object from
    the one in the main process.
    ``rng`` holds this worker's own generators (``random_generator``,
    ``numpy_generator``, ``torch_generator``), seeded like the worker and reseeded
    with ``reseed``: draw from them and the draws are the same for every kind of
    worker. ``worker_method`` is ``"multiprocessing"`` or ``"thread"``, as torch's.
    """

    #: This worker's id, from 0 to ``num_workers - 1``.
    id: int
    #: How many workers the loader has.
    num_workers: int
    #: This worker's seed: the loader's base seed plus ``id``, as torch's.
    seed: int
    #: This worker's own copy of the dataset.
    dataset: Any
    #: This worker's own generators (``random_generator``, ``numpy_generator``,
    #: ``torch_generator``).
    rng: WorkerRng | None = None
    #: ``"multiprocessing"`` or ``"thread"``, as torch's.
    worker_method: str = "multiprocessing"


# Where users import it from (conveyor.worker_info): its repr and pickles name that module.
# Set after the class is made: @dataclass resolves its annotations in the defining module.
WorkerInfo.__module__ = "conveyor.worker_info"


class _GlobalGenerators:
    """The process's own generators: ``random``, NumPy's global ``RandomState`` and
    torch's default CPU generator (if torch is imported), as torch's process workers
    seed them."""

    def seed_each(self, python: int, numpy_seed: Any, torch_seed: int) -> None:
        random.seed(python)
        np.random.seed(numpy_seed)
        torch = sys.modules.get("torch")
        if torch is not None:
            # Not torch.manual_seed: that also visits every accelerator backend, about
            # 100 times slower, once per sample with reseed="sample".
            torch.default_generator.manual_seed(torch_seed)

    def seed(self, seed: int) -> None:
        self.seed_each(seed, seed & 0xFFFFFFFF, seed)


GLOBAL_GENERATORS = _GlobalGenerators()
_SEEDED = object()  # a stand-in's seed was applied


class ModuleStandIns:
    """What ``random``'s and NumPy's module functions draw from in a thread core (see
    conveyor._workers.thread_draws): a ``random.Random`` and a legacy ``numpy.random.RandomState``
    of its own, seeded and reseeded exactly as a process worker's module generators are,
    so ``random.random()`` or ``np.random.rand()`` in ``__getitem__`` draw the same on a
    thread as on a process. Each is made, or reseeded, on first use after a seeding:
    ``reseed="sample"`` costs nothing where the dataset does not draw."""

    __slots__ = ("_numpy", "_numpy_seed", "_python_seed", "_random")

    def __init__(self) -> None:
        self._random: random.Random | None = None
        self._numpy: np.random.RandomState | None = None
        self._python_seed: Any = 0
        self._numpy_seed: Any = 0

    def seed_each(self, python: int, numpy_seed: Any) -> None:
        self._python_seed, self._numpy_seed = python, numpy_seed

    @property
    def random(self) -> random.Random:
        if self._random is None:
            self._random = random.Random(self._python_seed)
        elif self._python_seed is not _SEEDED:
            self._random.seed(self._python_seed)
        self._python_seed = _SEEDED
        return self._random

    @property
    def numpy(self) -> np.random.RandomState:
        if self._numpy is None:
            self._numpy = np.random.RandomState(self._numpy_seed)
        elif self._numpy_seed is not _SEEDED:
            self._numpy.seed(self._numpy_seed)
        self._numpy_seed = _SEEDED
        return self._numpy


@dataclass(eq=False)
class WorkerScope:
    """One core's state (see the module docstring). Compared by identity."""

    info: WorkerInfo | None = None
    # Our collate leaves tensors to the main process (see _collate_walk.make_tensors_in_main).
    tensors_in_main: bool = False
    # The dataset asked get_worker_info() (ours or torch's): it probably shards.
    consulted: bool = False
    # Whether the process-wide generators are this core's to seed (one core in its
    # process, as torch's workers have): thread cores seed only their own, and draw from
    # ``module_draws`` where the code calls random's or NumPy's module functions.
    owns_globals: bool = True
    rng: WorkerRng = field(default_factory=WorkerRng)
    torch_info: Any = None  # ``info`` as torch's own WorkerInfo, made when torch asks
    module_draws: ModuleStandIns | None = None

    def __post_init__(self) -> None:
        if not self.owns_globals:
            self.module_draws = ModuleStandIns()

    def seed_each(self, python: int, numpy_seed: Any, torch_seed: int) -> None:
        if self.module_draws is None:
            GLOBAL_GENERATORS.seed_each(python, numpy_seed, torch_seed)
        else:
            self.module_draws.seed_each(python, numpy_seed)
        self.rng.seed_each(python, numpy_seed, torch_seed)

    def seed(self, seed: int) -> None:
        if self.module_draws is None:
            GLOBAL_GENERATORS.seed(seed)
        else:  # as GLOBAL_GENERATORS.seed seeds random and NumPy
            self.module_draws.seed_each(seed, seed & 0xFFFFFFFF)
        self.rng.seed(seed)


_current: contextvars.ContextVar[WorkerScope | None] = contextvars.ContextVar(
    "conveyor_worker_scope", default=None
)


def current() -> WorkerScope | None:
    """The scope of the core running here; None outside any worker (the main process)."""
    return _current.get()


class entered:
    """``with entered(scope):`` makes ``scope`` current, and the previous one after (a
    class, not a generator: entered once per task by cores that share a thread)."""

    __slots__ = ("_scope", "_token")

    def __init__(self, scope: WorkerScope) -> None:
        self._scope = scope

    def __enter__(self) -> WorkerScope:
        self._token = _current.set(self._scope)
        return self._scope

    def __exit__(self, *exc: object) -> None:
        _current.reset(self._token)


def enter_for_good(scope: WorkerScope) -> None:
    """Make ``scope`` current for the rest of this thread (a core that owns its thread
    or its process)."""
    _current.set(scope)
