"""Streaming collate without processes: samples written into their rows as they come
(conveyor.collate._rows, and TaskRunner's use of it) give the batch default_collate
gives, for every structure; a sample that does not fit makes the batch collate as before,
with the same result or the same error; skipping leaves out exactly the failing sample."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from tests.helpers.collate_maps import restored_collate_maps

from conveyor._task.runner import Collated, Failed, NothingLeft, TaskOutcome, TaskRunner
from conveyor._workers import scope as _scope
from conveyor.collate import (
    OUTPUT_ALLOCATOR,
    default_collate,
    default_collate_fn_map,
    numpy_collate,
)
from conveyor.collate import _plan as _collate_plan
from conveyor.collate._rows import RowWriter
from conveyor.errors import CollateKeyError, CollateShapeError

torch = pytest.importorskip("torch")
from tests.parity import big_samples as big  # noqa: E402
from tests.parity import datasets as small  # noqa: E402
from tests.parity.test_torch_parity import assert_batches_equal  # noqa: E402
from torch.utils.data import default_collate as torch_collate  # noqa: E402

pytestmark = pytest.mark.torch


def streamed(samples: list[Any], writer: RowWriter | None = None) -> Any:
    """The batch of ``samples`` written row by row (each must fit the plan)."""
    writer = writer or RowWriter(default_collate)
    batch = writer.begin(len(samples), contextlib.nullcontext)
    assert batch is not None, "the last plan streamed nothing"
    for sample in samples:
        assert batch.write(sample)
    return batch.finish()


def runner(dataset: Any, *, skip: bool = False, collate: Any = default_collate) -> TaskRunner:
    return TaskRunner(
        dataset,
        iterable=False,
        auto_collation=True,
        collate_fn=collate,
        drop_last=False,
        skip_errors=skip,
    )


def both(dataset: Any, index: list[int], **options: Any) -> tuple[TaskOutcome, TaskOutcome]:
    """One task run streaming, and the same run the way it was before streaming."""
    streaming, before = runner(dataset, **options), runner(dataset, **options)
    assert streaming.rows is not None
    before.rows = None
    return streaming.run(index), before.run(index)


def assert_same_outcome(got: TaskOutcome, expected: TaskOutcome) -> None:
    assert type(got) is type(expected), (got, expected)
    if isinstance(got, Collated):
        assert isinstance(expected, Collated)
        assert_batches_equal(got.batch, expected.batch)
        assert got.indices == expected.indices
        assert [(x.index, type(x.error), str(x.error)) for x in got.left_out] == [
            (x.index, type(x.error), str(x.error)) for x in expected.left_out
        ]
    elif isinstance(got, Failed):
        assert isinstance(expected, Failed)
        assert (got.stage, type(got.error), str(got.error)) == (
            expected.stage,
            type(expected.error),
            str(expected.error),
        )
        assert got.culprit == expected.culprit
    else:
        assert isinstance(got, NothingLeft) and isinstance(expected, NothingLeft)
        assert [(x.index, x.stage, str(x.error)) for x in got.left_out] == [
            (x.index, x.stage, str(x.error)) for x in expected.left_out
        ]


@contextlib.contextmanager
def output_memory(nbytes: int) -> Iterator[np.ndarray]:
    """An output allocator handing out ``nbytes`` of one buffer (a slot, in a worker)."""
    memory = np.zeros(nbytes, np.uint8)
    used = [0]

    def allocate(size: int) -> np.ndarray | None:
        start = -(-used[0] // 64) * 64
        if start + size > nbytes:
            return None
        used[0] = start + size
        return memory[start : start + size]

    token = OUTPUT_ALLOCATOR.set(allocate)
    try:
        yield memory
    finally:
        OUTPUT_ALLOCATOR.reset(token)


# --- every structure ------------------------------------------------------------------


@pytest.mark.parametrize("kind", big.KINDS)
def test_rows_give_default_collates_batch(kind: str) -> None:
    dataset = big.BigDataset(kind=kind)
    got, expected = both(dataset, [1, 2, 3, 4])
    assert_same_outcome(got, expected)
    assert isinstance(got, Collated)
    assert_batches_equal(got.batch, torch_collate([dataset[i] for i in (1, 2, 3, 4)]))
    writer = RowWriter(default_collate)
    if kind != "mapping_types":  # (an OrderedDict is collated as before)
        assert_batches_equal(streamed([dataset[i] for i in (1, 2, 3, 4)], writer), got.batch)
        assert writer.streams


@pytest.mark.parametrize("kind", small.KINDS)
def test_small_leaves_written_row_by_row_give_the_same_batch(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_collate_plan, "STREAM_MIN_BYTES", 1)
    dataset = small.MapDataset(kind=kind)
    got, expected = both(dataset, [2, 3, 4])
    assert_same_outcome(got, expected)
    assert isinstance(got, Collated)
    assert_batches_equal(got.batch, torch_collate([dataset[i] for i in (2, 3, 4)]))


def test_small_leaves_are_collated_as_before() -> None:
    samples = [small.make_sample("dict_numpy", i) for i in range(3)]
    writer = RowWriter(default_collate)
    batch = writer.begin(3, contextlib.nullcontext)
    assert batch is not None and not batch.write(samples[0])  # nothing worth a row
    assert writer.begin(3, contextlib.nullcontext) is None  # the next batch: as before
    writer.check(big.make_big("dict", 0))  # a batch of another shape came
    assert writer.begin(3, contextlib.nullcontext) is not None  # the next one may stream


@pytest.mark.parametrize("collate", [numpy_collate, torch_collate], ids=["numpy", "torch"])
def test_other_default_collates(collate: Callable[[Any], Any]) -> None:
    samples = [big.make_big("nested", i) for i in range(4)]
    writer = RowWriter.for_collate(collate)
    assert writer is not None
    assert_batches_equal(streamed(samples, writer), collate(samples))


def test_only_default_collates_stream() -> None:
    assert RowWriter.for_collate(lambda batch: batch) is None
    assert RowWriter.for_collate(small.collate_numpy) is None


def test_rows_go_into_the_output_allocators_memory() -> None:
    samples = [big.make_big("tuple", i) for i in range(4)]
    with output_memory(1 << 20) as memory:
        images, labels = streamed(samples)
    assert np.shares_memory(images.numpy(), memory)
    assert_batches_equal([images, labels], default_collate(samples))


def test_registered_function_gets_its_column() -> None:
    def as_list(batch: Any, *, collate_fn_map: Any = None) -> Any:
        return [str(x) for x in batch]

    samples = [(big.image(i), small.Point(i, i)) for i in range(3)]
    with restored_collate_maps():
        default_collate_fn_map[small.Point] = as_list
        writer = RowWriter(default_collate)
        out = streamed(samples, writer)
        assert writer.streams
        assert_batches_equal(out, default_collate(samples))


def test_worker_deferring_torch_streams_numpy_and_turns_to_torch_for_tensors() -> None:
    with _scope.entered(_scope.WorkerScope(tensors_in_main=True)):
        arrays = [big.make_big("tuple", i) for i in range(3)]
        out = streamed(arrays)
        assert [type(x) for x in out] == [np.ndarray, np.ndarray]  # tensors made in main
        assert_batches_equal(out, default_collate(arrays))
        tensors = [big.make_big("tensors", i) for i in range(3)]
        assert_batches_equal(streamed(tensors), default_collate(tensors))


class Unwraps(torch.Tensor):
    """A subclass whose torch results come back plain tensors, as torchvision's
    tv_tensors (``Image``: what its v2 transforms return) do."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class KeepsItsType(torch.Tensor):
    """A subclass torch's results keep (the default): ``default_collate`` stacks it into
    one of its own kind."""


class Refuses(torch.Tensor):
    """A subclass whose own rules refuse what planning a row asks of it."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func == torch.Tensor.is_nested.__get__:  # (a new method-wrapper each time)
            raise RuntimeError("not for this subclass")
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def _images(kind: type, count: int = 3) -> list[tuple[Any, int]]:
    # 27 KB each: over STREAM_MIN_BYTES, worth a row
    return [(torch.full((3, 48, 48), float(i)).as_subclass(kind), i) for i in range(count)]


def test_a_tensor_subclass_torch_stacks_plain_is_streamed_into_torchs_batch() -> None:
    samples = _images(Unwraps)
    expected = torch_collate(samples)
    assert type(expected[0]) is torch.Tensor  # torch's own collate: a plain tensor
    writer = RowWriter(default_collate)
    got = streamed(samples, writer)
    assert writer.streams  # written row by row: no sample kept until the end
    assert type(got[0]) is torch.Tensor
    assert_batches_equal(got, expected)


def test_a_tensor_subclass_that_keeps_its_type_is_collated_as_before() -> None:
    samples = _images(KeepsItsType)
    expected = torch_collate(samples)
    assert type(expected[0]) is KeepsItsType
    writer = RowWriter(default_collate)
    batch = writer.begin(len(samples), contextlib.nullcontext)
    assert batch is not None and not batch.write(samples[0])  # nothing worth a row
    got = default_collate(samples)  # (what the runner does then)
    assert type(got[0]) is KeepsItsType
    assert_batches_equal(got, expected)


def test_a_tensor_subclass_that_refuses_to_be_planned_is_collated_as_before() -> None:
    samples = _images(Refuses)
    writer = RowWriter(default_collate)
    batch = writer.begin(len(samples), contextlib.nullcontext)
    assert batch is not None and not batch.write(samples[0])  # no error: not worth a row
    for collate in (default_collate, torch_collate):  # then as before: torch's own error
        with pytest.raises(RuntimeError, match="not for this subclass"):
            collate(samples)


def test_a_later_batch_of_another_shape_gets_its_own_plan() -> None:
    writer = RowWriter(default_collate)
    for kind in ("tuple", "dict", "tuple"):
        samples = [big.make_big(kind, i) for i in range(3)]
        assert_batches_equal(streamed(samples, writer), default_collate(samples))


def test_rows_written_so_far_rebuild_the_samples() -> None:
    samples = [big.make_big("nested", i) for i in range(3)]
    writer = RowWriter(default_collate)
    batch = writer.begin(4, contextlib.nullcontext)
    assert batch is not None
    for sample in samples:
        assert batch.write(sample)
    assert not batch.write(big.make_big("tuple", 9))  # does not fit
    rebuilt = batch.samples()
    assert len(rebuilt) == 3
    for got, sample in zip(rebuilt, samples, strict=True):
        assert_batches_equal(got, sample)


def test_memmap_rows_come_back_as_memmaps(tmp_path: Any) -> None:
    data = np.memmap(tmp_path / "data", np.float32, "w+", shape=(4, *big.IMAGE))
    samples = [(data[i], i) for i in range(4)]
    writer = RowWriter(default_collate)
    batch = writer.begin(4, contextlib.nullcontext)
    assert batch is not None
    assert batch.write(samples[0]) and batch.write(samples[1])
    assert [type(s[0]) for s in batch.samples()] == [np.memmap, np.memmap]
    assert_batches_equal(streamed(samples, writer), default_collate(samples))


# --- TaskRunner: fallbacks, errors, skipping --------------------------------------------


@pytest.mark.parametrize("change", ["dtype", "tensor", "label"])
def test_a_sample_that_does_not_fit_collates_the_batch_as_before(change: str) -> None:
    dataset = big.ChangingDataset(change, at=6)
    for index in ([4, 5, 6, 7], [6, 7, 8], [8, 9, 10, 11]):
        got, expected = both(dataset, index)
        assert_same_outcome(got, expected)
        samples = [dataset[i] for i in index]
        if change == "tensor" and index[0] == 6:  # torch's rule for tensors refuses arrays
            with pytest.raises(TypeError):
                torch_collate(samples)
            continue
        assert isinstance(got, Collated)
        assert_batches_equal(got.batch, torch_collate(samples))


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("change", ["shape", "missing"])
def test_collate_errors_are_the_ones_collate_raises(change: str, skip: bool) -> None:
    got, expected = both(big.ChangingDataset(change, at=6), [4, 5, 6, 7], skip=skip)
    assert_same_outcome(got, expected)
    if not skip:
        assert isinstance(got, Failed)
        assert isinstance(got.error, CollateShapeError if change == "shape" else CollateKeyError)
        assert "dataset index 6" in str(got.error)
        if change == "missing":
            assert "'label'" in str(got.error)


def test_skipping_leaves_out_exactly_the_failing_sample() -> None:
    dataset = big.ChangingDataset("raise", at=6)
    got, expected = both(dataset, [4, 5, 6, 7], skip=True)
    assert_same_outcome(got, expected)
    assert isinstance(got, Collated)
    assert got.indices == [4, 5, 7]
    assert [x.index for x in got.left_out] == [6]
    assert_batches_equal(got.batch, torch_collate([dataset[i] for i in (4, 5, 7)]))


def test_skipping_into_the_output_memory_keeps_the_rows_written() -> None:
    dataset = big.ChangingDataset("raise", at=5)
    with output_memory(1 << 20) as memory:
        got = runner(dataset, skip=True).run([4, 5, 6])
    assert isinstance(got, Collated)
    images = got.batch[0]
    assert images.shape[0] == 2 and np.shares_memory(images.numpy(), memory)
    assert_batches_equal(got.batch, torch_collate([dataset[4], dataset[6]]))


def test_a_failing_sample_without_skipping_is_named() -> None:
    got, expected = both(big.ChangingDataset("raise", at=6), [5, 6, 7])
    assert_same_outcome(got, expected)
    assert isinstance(got, Failed) and got.culprit is not None
    assert got.culprit.indices == (6,)


def test_every_sample_failing_leaves_nothing() -> None:
    got, expected = both(big.ChangingDataset("raise", at=6), [6], skip=True)
    assert_same_outcome(got, expected)
    assert isinstance(got, NothingLeft)


def test_stop_iteration_in_getitem_is_an_error() -> None:
    class Stops(big.BigDataset):
        def __getitem__(self, i: int) -> Any:
            if i == 2:
                raise StopIteration
            return super().__getitem__(i)

    got, expected = both(Stops(), [1, 2, 3])
    assert_same_outcome(got, expected)
    assert isinstance(got, Failed) and isinstance(got.error, RuntimeError)


def test_excluded_samples_are_not_fetched() -> None:
    streaming = runner(big.ChangingDataset("raise", at=6))
    got = streaming.run([5, 6, 7], exclude=(6,))
    assert isinstance(got, Collated) and got.indices == [5, 7]


def test_a_batch_whose_every_sample_is_excluded_fetches_nothing() -> None:
    """A sample proven to kill its worker, alone in its batch (batch_size=1): the retry
    leaves it out and fetches nothing (fetching it again killed every replacement)."""
    streaming = runner(big.ChangingDataset("raise", at=6), skip=True)
    assert streaming.rows is not None
    assert isinstance(streaming.run([5]), Collated)  # a plan exists: the next would stream
    got = streaming.run([6], exclude=(6,))
    assert isinstance(got, NothingLeft) and got.left_out == ()


def test_an_empty_batch_is_collates_error() -> None:
    got, expected = both(big.BigDataset(), [])
    assert_same_outcome(got, expected)
    assert isinstance(got, Failed) and isinstance(got.error, IndexError)


def test_each_sample_is_dropped_once_in_its_row() -> None:
    dataset = big.HoldDataset()
    got = runner(dataset).run([0, 1, 2, 3])
    assert isinstance(got, Collated)
    assert got.batch[1].tolist() == [False] * 4
    before = runner(big.HoldDataset())
    before.rows = None
    expected = before.run([0, 1, 2, 3])
    assert isinstance(expected, Collated)
    assert expected.batch[1].tolist() == [False, True, True, True]


def test_samples_the_dataset_keeps_are_collated_as_before_after_the_first_batch() -> None:
    """Arrays that outlive their sample (the dataset holds them) free nothing when dropped:
    from the next batch on they are collated as before; fresh ones keep streaming."""
    kept = [big.image(i) for i in range(4)]

    class Keeps(big.BigDataset):
        def __getitem__(self, i: int) -> Any:
            return kept[i % 4], i

    held, fresh = runner(Keeps()), runner(big.BigDataset())
    for first in (0, 4):
        index = list(range(first, first + 4))
        for streaming, dataset in ((held, Keeps()), (fresh, big.BigDataset())):
            got = streaming.run(index)
            assert isinstance(got, Collated)
            assert_batches_equal(got.batch, torch_collate([dataset[i] for i in index]))
    assert held.rows is not None and not held.rows.streams
    assert fresh.rows is not None and fresh.rows.streams
