"""conveyor.sampling: same indices, lengths and errors as torch's samplers; NumPy without torch."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from conveyor import sampling
from conveyor.sampling import _rng_backends

SEEDS = [0, 1, 7, 2024, 987654321]


@pytest.fixture
def torch() -> ModuleType:
    return pytest.importorskip("torch")


@pytest.fixture
def tsampler(torch: ModuleType) -> ModuleType:
    from torch.utils.data import sampler as torch_sampler

    return torch_sampler


@pytest.fixture
def numpy_mode(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """conveyor.sampling as it behaves when torch is not installed (its draws are made by
    conveyor.sampling._rng_backends)."""
    monkeypatch.setattr(_rng_backends, "torch", None)
    return sampling


def epochs(sampler: Any, count: int = 3) -> list[list[Any]]:
    return [list(sampler) for _ in range(count)]


def torch_generator(torch: ModuleType, seed: int) -> Any:
    return torch.Generator().manual_seed(seed)


def assert_same_under_global_seed(
    torch: ModuleType, seed: int, ours: Any, theirs: Any, count: int = 3
) -> None:
    """Same indices for several epochs after torch.manual_seed, and the same RNG left behind."""
    torch.manual_seed(seed)
    expected = epochs(theirs, count)
    expected_next = torch.rand(4)
    torch.manual_seed(seed)
    got = epochs(ours, count)
    assert got == expected
    assert torch.equal(torch.rand(4), expected_next)


def assert_plain_ints(values: list[Any]) -> None:
    assert all(type(v) is int for v in values)


# --- SequentialSampler / base class ------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 5, 33])
def test_sequential_sampler_yields_range(n: int) -> None:
    s = sampling.SequentialSampler(list(range(n)))
    assert list(s) == list(range(n))
    assert len(s) == n
    assert_plain_ints(list(s))


def test_sampler_base_has_no_len_and_no_iter() -> None:
    base: sampling.Sampler[int] = sampling.Sampler()
    with pytest.raises(TypeError):
        len(base)  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError):
        iter(base)


# --- RandomSampler vs torch ---------------------------------------------------

RANDOM_CONFIGS = [
    pytest.param(10, False, None, id="perm"),
    pytest.param(10, False, 3, id="perm-fewer"),
    pytest.param(10, False, 20, id="perm-exact-multiple"),
    pytest.param(10, False, 25, id="perm-more"),
    pytest.param(1, False, None, id="perm-single"),
    pytest.param(7, True, None, id="repl"),
    pytest.param(7, True, 32, id="repl-one-chunk"),
    pytest.param(7, True, 64, id="repl-two-chunks"),
    pytest.param(50, True, 101, id="repl-chunks-and-rest"),
    pytest.param(5, True, 1, id="repl-one"),
]


@pytest.mark.torch
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("n", "replacement", "num_samples"), RANDOM_CONFIGS)
def test_random_sampler_matches_torch_global_seed(
    torch: ModuleType, tsampler: ModuleType, seed: int, n: int, replacement: bool, num_samples: Any
) -> None:
    data = list(range(n))
    ours = sampling.RandomSampler(data, replacement=replacement, num_samples=num_samples)
    theirs = tsampler.RandomSampler(data, replacement=replacement, num_samples=num_samples)
    assert_same_under_global_seed(torch, seed, ours, theirs)
    assert len(ours) == len(theirs) == len(list(ours))


@pytest.mark.torch
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("n", "replacement", "num_samples"), RANDOM_CONFIGS)
def test_random_sampler_matches_torch_generator(
    torch: ModuleType, tsampler: ModuleType, seed: int, n: int, replacement: bool, num_samples: Any
) -> None:
    data = list(range(n))
    ours_gen, theirs_gen = torch_generator(torch, seed), torch_generator(torch, seed)
    ours = sampling.RandomSampler(data, replacement, num_samples, generator=ours_gen)
    theirs = tsampler.RandomSampler(data, replacement, num_samples, generator=theirs_gen)
    got = epochs(ours)
    assert got == epochs(theirs)
    assert torch.equal(ours_gen.get_state(), theirs_gen.get_state())
    assert_plain_ints(got[0])


@pytest.mark.torch
@pytest.mark.parametrize("seed", SEEDS)
def test_random_sampler_draws_its_seed_lazily_like_torch(
    torch: ModuleType, tsampler: ModuleType, seed: int
) -> None:
    # DataLoader calls iter(sampler) and *then* draws the base seed from the global RNG:
    # the sampler's own seed must be drawn after that, on the first next().
    def run(sampler: Any, draw: Callable[[], int]) -> tuple[int, list[int]]:
        torch.manual_seed(seed)
        it = iter(sampler)
        base = draw()
        return base, list(it)

    def torch_draw() -> int:
        return int(torch.empty((), dtype=torch.int64).random_().item())

    data = range(40)
    expected = run(tsampler.RandomSampler(data), torch_draw)
    assert run(sampling.RandomSampler(data), lambda: sampling.draw_base_seed(None)) == expected


def test_random_sampler_num_samples_follows_data_source_size() -> None:
    data = [0, 1, 2]
    s = sampling.RandomSampler(data)
    data.extend([3, 4])
    assert len(s) == 5
    assert sorted(s) == [0, 1, 2, 3, 4]


# --- SubsetRandomSampler vs torch ---------------------------------------------

SUBSETS = [
    pytest.param([10, 3, 99, 42, 7], id="list"),
    pytest.param(range(100, 140, 3), id="range"),
    pytest.param([5], id="single"),
    pytest.param([], id="empty"),
]


@pytest.mark.torch
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("indices", SUBSETS)
def test_subset_random_sampler_matches_torch(
    torch: ModuleType, tsampler: ModuleType, seed: int, indices: Any
) -> None:
    assert_same_under_global_seed(
        torch, seed, sampling.SubsetRandomSampler(indices), tsampler.SubsetRandomSampler(indices)
    )
    ours = sampling.SubsetRandomSampler(indices, generator=torch_generator(torch, seed))
    theirs = tsampler.SubsetRandomSampler(indices, generator=torch_generator(torch, seed))
    got = epochs(ours)
    assert got == epochs(theirs)
    assert len(ours) == len(indices)
    assert all(sorted(epoch) == sorted(indices) for epoch in got)


# --- WeightedRandomSampler vs torch -------------------------------------------

WEIGHTED_CONFIGS = [
    pytest.param([0.1, 0.9, 0.4, 0.7, 3.0, 0.6], 5, True, id="repl"),
    pytest.param([0.1, 0.9, 0.4, 0.7, 3.0, 0.6], 100, True, id="repl-many"),
    pytest.param([0.9, 0.4, 0.05, 0.2, 0.3, 0.1], 5, False, id="no-repl"),
    pytest.param([1, 2, 3, 4], 4, False, id="no-repl-all-int-weights"),
    pytest.param([2.0, 0.0, 1.0], 7, True, id="zero-weight"),
]


@pytest.mark.torch
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("weights", "num_samples", "replacement"), WEIGHTED_CONFIGS)
def test_weighted_random_sampler_matches_torch(
    torch: ModuleType,
    tsampler: ModuleType,
    seed: int,
    weights: list[float],
    num_samples: int,
    replacement: bool,
) -> None:
    ours = sampling.WeightedRandomSampler(weights, num_samples, replacement)
    theirs = tsampler.WeightedRandomSampler(weights, num_samples, replacement)
    assert_same_under_global_seed(torch, seed, ours, theirs)
    ours = sampling.WeightedRandomSampler(
        weights, num_samples, replacement, generator=torch_generator(torch, seed)
    )
    theirs = tsampler.WeightedRandomSampler(
        weights, num_samples, replacement, generator=torch_generator(torch, seed)
    )
    got = epochs(ours)
    assert got == epochs(theirs)
    assert_plain_ints(got[0])
    assert len(ours) == num_samples
    assert ours.weights.dtype == torch.float64
    assert torch.equal(ours.weights, theirs.weights)


@pytest.mark.torch
def test_weighted_random_sampler_accepts_tensor_weights(
    torch: ModuleType, tsampler: ModuleType
) -> None:
    weights = torch.tensor([1.0, 5.0, 2.0], dtype=torch.float32)
    ours = sampling.WeightedRandomSampler(weights, 9, generator=torch_generator(torch, 3))
    theirs = tsampler.WeightedRandomSampler(weights, 9, generator=torch_generator(torch, 3))
    assert list(ours) == list(theirs)


# --- BatchSampler -------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.parametrize("seed", SEEDS[:3])
@pytest.mark.parametrize("batch_size", [1, 3, 4, 10, 11])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler_over_torch_sampler_matches_torch(
    torch: ModuleType, tsampler: ModuleType, seed: int, batch_size: int, drop_last: bool
) -> None:
    base_ours = tsampler.RandomSampler(range(10), generator=torch_generator(torch, seed))
    base_theirs = tsampler.RandomSampler(range(10), generator=torch_generator(torch, seed))
    ours = sampling.BatchSampler(base_ours, batch_size, drop_last)
    theirs = tsampler.BatchSampler(base_theirs, batch_size, drop_last)
    got = epochs(ours, 2)
    assert got == epochs(theirs, 2)
    assert len(ours) == len(theirs) == len(got[0])
    assert all(type(batch) is list for batch in got[0])


@pytest.mark.parametrize(
    ("n", "batch_size", "drop_last", "expected"),
    [
        (10, 3, False, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]),
        (10, 3, True, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]),
        (9, 3, True, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]),
        (2, 3, True, []),
        (2, 3, False, [[0, 1]]),
        (0, 3, False, []),
    ],
)
def test_batch_sampler_batches_and_len(
    n: int, batch_size: int, drop_last: bool, expected: list[list[int]]
) -> None:
    for source in (range(n), list(range(n)), sampling.SequentialSampler(range(n))):
        s = sampling.BatchSampler(source, batch_size, drop_last)
        assert list(s) == expected
        assert len(s) == len(expected)


@pytest.mark.torch
@pytest.mark.parametrize("n", [0, 1, 7, 30, 31])
@pytest.mark.parametrize("batch_size", [1, 2, 7, 8])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler_len_matches_torch(
    tsampler: ModuleType, n: int, batch_size: int, drop_last: bool
) -> None:
    ours = sampling.BatchSampler(range(n), batch_size, drop_last)
    assert len(ours) == len(tsampler.BatchSampler(range(n), batch_size, drop_last))


def test_batch_sampler_accepts_a_generator_iterable() -> None:
    class Evens:
        def __iter__(self) -> Iterator[int]:
            return iter(range(0, 10, 2))

    assert list(sampling.BatchSampler(Evens(), 2, drop_last=False)) == [[0, 2], [4, 6], [8]]
    with pytest.raises(TypeError):
        len(sampling.BatchSampler(Evens(), 2, drop_last=False))


def test_infinite_constant_sampler_yields_none_forever() -> None:
    it = iter(sampling.InfiniteConstantSampler())
    assert [next(it) for _ in range(1000)] == [None] * 1000


# --- argument errors: same types as torch ------------------------------------

BAD_ARGUMENTS: list[Any] = [
    pytest.param(lambda m: m.RandomSampler(range(3), replacement=1), TypeError, id="rs-repl-int"),
    pytest.param(lambda m: m.RandomSampler(range(3), replacement="y"), TypeError, id="rs-repl-str"),
    pytest.param(lambda m: m.RandomSampler(range(3), num_samples=0), ValueError, id="rs-ns-0"),
    pytest.param(lambda m: m.RandomSampler(range(3), num_samples=-2), ValueError, id="rs-ns-neg"),
    pytest.param(lambda m: m.RandomSampler(range(3), num_samples=2.0), ValueError, id="rs-ns-fl"),
    pytest.param(lambda m: m.RandomSampler([]), ValueError, id="rs-empty"),
    pytest.param(lambda m: m.WeightedRandomSampler([1.0], 0), ValueError, id="w-ns-0"),
    pytest.param(lambda m: m.WeightedRandomSampler([1.0], True), ValueError, id="w-ns-bool"),
    pytest.param(lambda m: m.WeightedRandomSampler([1.0], 2.0), ValueError, id="w-ns-float"),
    pytest.param(lambda m: m.WeightedRandomSampler([1.0], 1, 1), ValueError, id="w-repl-int"),
    pytest.param(lambda m: m.WeightedRandomSampler([[1.0, 2.0]], 1), ValueError, id="w-2d"),
    pytest.param(lambda m: m.WeightedRandomSampler(3.0, 1), ValueError, id="w-scalar"),
    pytest.param(lambda m: m.BatchSampler(range(3), 0, False), ValueError, id="b-bs-0"),
    pytest.param(lambda m: m.BatchSampler(range(3), -1, False), ValueError, id="b-bs-neg"),
    pytest.param(lambda m: m.BatchSampler(range(3), True, False), ValueError, id="b-bs-bool"),
    pytest.param(lambda m: m.BatchSampler(range(3), 2.0, False), ValueError, id="b-bs-float"),
    pytest.param(lambda m: m.BatchSampler(range(3), 2, 0), ValueError, id="b-dl-int"),
    pytest.param(lambda m: m.BatchSampler(range(3), 2, None), ValueError, id="b-dl-none"),
]


@pytest.mark.parametrize("backend", ["conveyor", "conveyor-numpy", "torch"])
@pytest.mark.parametrize(("make", "error"), BAD_ARGUMENTS)
def test_bad_arguments_raise_torchs_exception_type(
    request: pytest.FixtureRequest, backend: str, make: Callable[[Any], Any], error: type
) -> None:
    if backend == "torch":
        module = request.getfixturevalue("tsampler")
    elif backend == "conveyor-numpy":
        module = request.getfixturevalue("numpy_mode")
    else:
        module = sampling
    with pytest.raises(error, match=r"should be|shape"):
        make(module)


BAD_WEIGHTS = [
    pytest.param([1.0, 2.0], 3, False, id="more-than-categories"),
    pytest.param([0.0, 0.0], 1, True, id="all-zero"),
    pytest.param([-1.0, 2.0], 1, True, id="negative"),
    pytest.param([float("nan"), 1.0], 1, False, id="nan"),
    pytest.param([float("inf"), 1.0], 1, True, id="inf"),
    pytest.param([], 1, True, id="empty"),
]


@pytest.mark.parametrize("backend", ["conveyor", "conveyor-numpy-generator", "torch"])
@pytest.mark.parametrize(("weights", "num_samples", "replacement"), BAD_WEIGHTS)
def test_invalid_weights_raise_runtime_error_when_iterated(
    request: pytest.FixtureRequest,
    backend: str,
    weights: list[float],
    num_samples: int,
    replacement: bool,
) -> None:
    module = request.getfixturevalue("tsampler") if backend == "torch" else sampling
    generator = np.random.default_rng(0) if backend.endswith("generator") else None
    if backend == "conveyor" and sampling.torch is None:
        pytest.skip("covered by the numpy backend")
    s = module.WeightedRandomSampler(weights, num_samples, replacement, generator=generator)
    with pytest.raises(RuntimeError):
        list(s)


@pytest.mark.parametrize("bad", ["seed", 1.5, True, object()])
def test_unsupported_generator_is_a_type_error(bad: object) -> None:
    for make in (
        lambda: sampling.RandomSampler(range(3), generator=bad),
        lambda: sampling.SubsetRandomSampler([1, 2], generator=bad),
        lambda: sampling.WeightedRandomSampler([1.0], 1, generator=bad),
    ):
        with pytest.raises(TypeError, match="generator"):
            make()
    with pytest.raises(TypeError, match="generator"):
        sampling.draw_base_seed(bad)


# --- NumPy backend (in-process: numpy generators, and torch patched away) -----


@pytest.mark.parametrize("seed", SEEDS)
def test_numpy_generator_is_deterministic_and_advances(seed: int) -> None:
    def make() -> list[Any]:
        rng = np.random.default_rng(seed)
        return [
            sampling.RandomSampler(range(20), generator=rng),
            sampling.RandomSampler(range(20), True, 70, generator=rng),
            sampling.SubsetRandomSampler([4, 8, 15, 16, 23, 42], generator=rng),
            sampling.WeightedRandomSampler([1.0, 2.0, 0.5, 4.0], 6, generator=rng),
            sampling.WeightedRandomSampler([1.0, 2.0, 0.5, 4.0], 3, False, generator=rng),
        ]

    first = [epochs(s) for s in make()]
    assert first == [epochs(s) for s in make()]
    perm_epochs = first[0]
    assert perm_epochs[0] != perm_epochs[1]
    for per_sampler in first:
        assert_plain_ints(per_sampler[0])


def test_int_seed_means_a_reproducible_numpy_stream() -> None:
    a = sampling.RandomSampler(range(30), generator=5)
    b = sampling.RandomSampler(range(30), generator=5)
    assert a.generator == 5
    ea, eb = epochs(a), epochs(b)
    assert ea == eb
    assert ea[0] != ea[1]
    assert ea == epochs(sampling.RandomSampler(range(30), generator=np.random.default_rng(5)))


@pytest.mark.parametrize(("n", "num_samples"), [(10, None), (10, 4), (10, 23), (1, 3)])
def test_numpy_random_sampler_without_replacement_is_repeated_permutations(
    numpy_mode: ModuleType, n: int, num_samples: Any
) -> None:
    s = numpy_mode.RandomSampler(range(n), num_samples=num_samples)
    total = n if num_samples is None else num_samples
    for epoch in epochs(s):
        assert_plain_ints(epoch)
        assert len(epoch) == len(s) == total
        full, rest = divmod(total, n)
        for k in range(full):
            assert sorted(epoch[k * n : (k + 1) * n]) == list(range(n))
        assert len(set(epoch[full * n :])) == rest


def test_numpy_random_sampler_with_replacement(numpy_mode: ModuleType) -> None:
    s = numpy_mode.RandomSampler(range(4), replacement=True, num_samples=1000, generator=3)
    drawn = list(s)
    assert len(drawn) == len(s) == 1000
    counts = Counter(drawn)
    assert set(counts) == {0, 1, 2, 3}
    assert all(200 < c < 300 for c in counts.values())


def test_numpy_global_none_generator_is_fresh_each_epoch(numpy_mode: ModuleType) -> None:
    s = numpy_mode.RandomSampler(range(200))
    a, b = list(s), list(s)
    assert sorted(a) == sorted(b) == list(range(200))
    assert a != b


def test_numpy_weighted_sampler_semantics(numpy_mode: ModuleType) -> None:
    rng = np.random.default_rng(11)
    s = numpy_mode.WeightedRandomSampler([0.0, 1.0, 0.0, 3.0], 4000, generator=rng)
    assert isinstance(s.weights, np.ndarray)
    assert s.weights.dtype == np.float64
    counts = Counter(s)
    assert set(counts) == {1, 3}
    assert 2.6 < counts[3] / counts[1] < 3.4
    no_repl = numpy_mode.WeightedRandomSampler([0.0, 1.0, 0.0, 3.0], 4, False, generator=rng)
    firsts = Counter()
    for epoch in epochs(no_repl, 2000):
        assert sorted(epoch) == [0, 1, 2, 3]
        assert set(epoch[:2]) == {1, 3}
        firsts[epoch[0]] += 1
    assert 0.7 < firsts[3] / 2000 < 0.8


def test_numpy_weighted_without_replacement_is_sequential_draw(numpy_mode: ModuleType) -> None:
    # Each index is drawn with probability proportional to the weights still left, as in torch.
    weights = [1.0, 2.0, 4.0]
    s = numpy_mode.WeightedRandomSampler(weights, 3, False, generator=np.random.default_rng(5))
    orders = Counter(tuple(epoch) for epoch in epochs(s, 6000))
    for order in [(2, 1, 0), (2, 0, 1), (1, 2, 0), (1, 0, 2), (0, 2, 1), (0, 1, 2)]:
        left, expected = sum(weights), 1.0
        for i in order:
            expected *= weights[i] / left
            left -= weights[i]
        assert abs(orders[order] / 6000 - expected) < 0.02, (order, orders)


def test_numpy_draw_base_seed(numpy_mode: ModuleType) -> None:
    seeds = [numpy_mode.draw_base_seed(np.random.default_rng(4)) for _ in range(2)]
    assert seeds[0] == seeds[1]
    assert 0 <= seeds[0] < 2**63
    fresh = {numpy_mode.draw_base_seed() for _ in range(5)}
    assert len(fresh) == 5
    assert all(type(s) is int and 0 <= s < 2**63 for s in fresh)


# --- seeds vs torch -----------------------------------------------------------


@pytest.mark.torch
@pytest.mark.parametrize("seed", SEEDS)
def test_draw_base_seed_matches_torch(torch: ModuleType, seed: int) -> None:
    torch.manual_seed(seed)
    expected = torch.empty((), dtype=torch.int64).random_().item()
    expected_next = torch.rand(3)
    torch.manual_seed(seed)
    assert sampling.draw_base_seed() == expected
    assert torch.equal(torch.rand(3), expected_next)

    gen = torch_generator(torch, seed)
    expected = torch.empty((), dtype=torch.int64).random_(generator=gen).item()
    assert sampling.draw_base_seed(torch_generator(torch, seed)) == expected


BASE_SEEDS = [0, 1, 12345, 2**32 - 1, 2**32, 2**40 + 17, 2**63 - 1, 8142735601938502913]


@pytest.mark.torch
@pytest.mark.parametrize("base_seed", BASE_SEEDS)
@pytest.mark.parametrize("worker_id", [0, 1, 5, 63])
def test_worker_seeds_match_torch(torch: ModuleType, base_seed: int, worker_id: int) -> None:
    from torch.utils.data._utils.worker import _generate_state

    seeds = sampling.worker_seeds(base_seed, worker_id)
    assert seeds.python == seeds.torch == base_seed + worker_id
    assert list(seeds.numpy) == _generate_state(base_seed, worker_id)


def test_worker_seeds_seed_numpy_and_are_frozen() -> None:
    seeds = sampling.worker_seeds(2**40 + 3, 2)
    assert all(type(w) is int and 0 <= w < 2**32 for w in seeds.numpy)
    assert seeds.numpy != sampling.worker_seeds(2**40 + 3, 3).numpy
    assert seeds == sampling.worker_seeds(2**40 + 3, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        seeds.python = 0  # type: ignore[misc]
    state = np.random.get_state()
    try:
        np.random.seed(seeds.numpy)
        a = np.random.random(3)
        np.random.seed(list(seeds.numpy))
        assert np.array_equal(a, np.random.random(3))
    finally:
        np.random.set_state(state)


# --- without torch at all (fresh interpreter with torch hidden) ---------------

_NO_TORCH_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.modules["torch"] = None
    import numpy as np
    from conveyor import sampling as s

    def run(seed):
        rng = np.random.default_rng(seed)
        return {
            "perm": [list(s.RandomSampler(range(12), generator=rng)) for _ in range(2)],
            "repl": list(s.RandomSampler(range(5), True, 40, generator=rng)),
            "subset": list(s.SubsetRandomSampler([9, 8, 7, 6], generator=rng)),
            "weighted": list(s.WeightedRandomSampler([0, 1, 0, 2.0], 10, generator=rng)),
            "batches": list(s.BatchSampler(s.RandomSampler(range(7), generator=rng), 3, False)),
        }

    errors = {}
    for name, make in [
        ("rs", lambda: s.RandomSampler(range(3), num_samples=0)),
        ("rs_repl", lambda: s.RandomSampler(range(3), replacement=1)),
        ("w_shape", lambda: s.WeightedRandomSampler([[1.0]], 1)),
        ("b", lambda: s.BatchSampler(range(3), 0, False)),
        ("w_iter", lambda: list(s.WeightedRandomSampler([0.0], 1))),
    ]:
        try:
            make()
        except Exception as exc:
            errors[name] = type(exc).__name__
    print(json.dumps({
        "torch_hidden": s.torch is None and sys.modules["torch"] is None,
        "a": run(3), "b": run(3), "c": run(4),
        "fresh": [list(s.RandomSampler(range(50))) for _ in range(2)],
        "base_seed": s.draw_base_seed(np.random.default_rng(1)),
        "base_seed_again": s.draw_base_seed(np.random.default_rng(1)),
        "weights_type": type(s.WeightedRandomSampler([1, 2], 1).weights).__name__,
        "errors": errors,
    }))
    """
)


@pytest.fixture(scope="module")
def no_torch_run() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _NO_TORCH_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_without_torch_module_imports_and_is_deterministic(no_torch_run: dict[str, Any]) -> None:
    r = no_torch_run
    assert r["torch_hidden"]
    assert r["a"] == r["b"]
    assert r["a"] != r["c"]
    assert r["base_seed"] == r["base_seed_again"]
    assert 0 <= r["base_seed"] < 2**63
    assert r["weights_type"] == "ndarray"


def test_without_torch_semantics(no_torch_run: dict[str, Any]) -> None:
    a = no_torch_run["a"]
    assert all(sorted(epoch) == list(range(12)) for epoch in a["perm"])
    assert a["perm"][0] != a["perm"][1]
    assert len(a["repl"]) == 40
    assert set(a["repl"]) == set(range(5))  # 40 draws: every index, some repeated
    assert sorted(a["subset"]) == [6, 7, 8, 9]
    assert set(a["weighted"]) <= {1, 3}
    assert [len(b) for b in a["batches"]] == [3, 3, 1]
    assert sorted(i for b in a["batches"] for i in b) == list(range(7))
    fresh = no_torch_run["fresh"]
    assert sorted(fresh[0]) == sorted(fresh[1]) == list(range(50))
    assert fresh[0] != fresh[1]


def test_without_torch_error_types(no_torch_run: dict[str, Any]) -> None:
    assert no_torch_run["errors"] == {
        "rs": "ValueError",
        "rs_repl": "TypeError",
        "w_shape": "ValueError",
        "b": "ValueError",
        "w_iter": "RuntimeError",
    }


def test_only_plain_sequential_batches_are_called_consecutive() -> None:
    """A plain BatchSampler over a plain SequentialSampler, torch's (what the loader makes
    with torch installed) or conveyor's: a subclass may order otherwise."""
    import conveyor
    from conveyor.sampling._defaults import consecutive_batches

    data = list(range(20))
    seq = conveyor.DataLoader(data, batch_size=4)._index_sampler
    assert consecutive_batches(seq)
    assert consecutive_batches(sampling.BatchSampler(sampling.SequentialSampler(data), 4, False))
    for batches in list(seq)[:3]:
        assert batches == list(range(batches[0], batches[0] + len(batches)))

    class Mine(sampling.SequentialSampler):
        def __iter__(self) -> Iterator[int]:
            return iter(reversed(range(len(self.data_source))))

    others = [
        conveyor.DataLoader(data, batch_size=4, shuffle=True)._index_sampler,
        conveyor.DataLoader(data, batch_size=4, sampler=Mine(data))._index_sampler,
        conveyor.DataLoader(data, batch_size=None)._index_sampler,
        conveyor.DataLoader(data, batch_sampler=[[0, 1], [3, 2]])._index_sampler,
    ]
    assert not any(consecutive_batches(s) for s in others)


@pytest.mark.parametrize(
    ("n", "size", "drop_last"),
    [(20, 4, False), (21, 4, False), (21, 4, True), (3, 8, False), (3, 8, True), (0, 2, False)],
)
def test_the_loop_draws_a_sequential_samplers_batches_as_ranges_of_torchs_very_indices(
    n: int, size: int, drop_last: bool
) -> None:
    """What the loop opens a plain sequential batch sampler as: the batches torch's
    ``BatchSampler`` yields, as ranges; a user iterating the sampler still gets lists."""
    from conveyor.sampling._defaults import RunBatches, batches, open_index, sequential

    data = list(range(n))
    batch_sampler = batches(sequential(data), size, drop_last)
    opened = open_index(batch_sampler)
    assert type(opened) is RunBatches
    drawn = list(opened)
    assert all(type(b) is range for b in drawn)
    assert [list(b) for b in drawn] == list(batch_sampler)
    assert all(type(b) is list for b in batch_sampler)
    assert opened.state_dict() == {"samples_yielded": sum(map(len, drawn))}


def test_a_sequential_samplers_ranges_resume_where_the_state_says_and_see_a_grown_dataset() -> None:
    from conveyor.sampling._defaults import batches, open_index, sequential

    data = list(range(10))
    batch_sampler = batches(sequential(data), 3, False)
    first = open_index(batch_sampler)
    next(first)
    state = first.state_dict()
    resumed = open_index(batch_sampler)
    resumed.load_state_dict(state)
    assert [list(b) for b in resumed] == [[3, 4, 5], [6, 7, 8], [9]]
    data.extend([10, 11])  # the length is taken at the first draw, as torch's iter() takes it
    assert [list(b) for b in open_index(batch_sampler)][-1] == [9, 10, 11]
