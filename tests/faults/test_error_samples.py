"""An error raised by user code names the sample that raised, not only its batch: with and
without workers (processes and threads), for ``__getitem__``, ``__getitems__``, an
iterable dataset and collate.

The exception keeps its type and is raised once; the note in the main process
(``num_workers=0``) is the workers' note without the worker's fields.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from conveyor import DataLoader, IterableDataset, get_worker_info
from conveyor.errors import CollateKeyError, Culprit

pytestmark = pytest.mark.timeout(90)

# Batch 1 of 64 samples, as notes show it: its first 16 indices.
BATCH_64 = f"batch 1 (dataset indices [{', '.join(map(str, range(64, 80)))}, ... (64 in all)])"


class Labels:
    """160 samples; dataset[77] has no label."""

    def __len__(self) -> int:
        return 160

    def __getitem__(self, index: int) -> int:
        if index == 77:
            raise KeyError(f"no label for sample {index}")
        return index


class LabelsAtOnce(Labels):
    """Fetches a batch in one call, as databases and Hugging Face datasets do."""

    def __getitems__(self, indices: list[int]) -> list[int]:
        return [self[i] for i in indices]


class Shards(IterableDataset):
    """Items 0..99, split over the workers; item 37 is in a truncated shard."""

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for item in range(first, 100, step):
            if item == 37:
                raise OSError("shard truncated at item 37")
            yield item


class Records:
    """Dicts with an 'image' key; dataset[5] lacks it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict[str, int]:
        return {"label": index} if index == 5 else {"image": index, "label": index}


# The dataset, its batch size, what it raises, the batch of the error and the sample.
CASES: dict[str, tuple[Any, int, type[BaseException], int, str, Culprit]] = {
    "getitem": (
        Labels(), 64, KeyError, 1,
        f"fetch of dataset index 77, in {BATCH_64}",
        Culprit((77,)),
    ),
    "getitems": (
        LabelsAtOnce(), 64, KeyError, 1,
        f"fetch of {BATCH_64}, in the dataset's __getitems__, which fetches the batch at "
        "once: which of its samples raised is not known",
        Culprit(whole_batch=True),
    ),
    "collate": (
        Records(), 4, CollateKeyError, 1,
        "collate of batch 1 (dataset indices [4, 5, 6, 7]), caused by dataset index 5",
        Culprit((5,)),
    ),
}  # fmt: skip


def _first_error(loader: DataLoader, error: type[BaseException]) -> tuple[BaseException, int]:
    """The first exception the loop raises, and how many batches came after it."""
    it = iter(loader)
    caught = None
    after = 0
    while True:
        try:
            next(it)
        except StopIteration:
            break
        except error as exc:
            assert caught is None, f"raised again: {exc!r}"  # the loop goes on, as torch's
            caught = exc
            continue
        after += caught is not None
    assert caught is not None, "nothing was raised"
    return caught, after


def _loader(dataset: Any, batch_size: int, start_method: str | None) -> DataLoader:
    """``start_method``: None for the main process, "thread" for thread workers."""
    if start_method is None:
        return DataLoader(dataset, batch_size=batch_size)
    if start_method == "thread":
        return DataLoader(dataset, batch_size=batch_size, num_workers=2, worker_method="thread")
    return DataLoader(
        dataset, batch_size=batch_size, num_workers=2, multiprocessing_context=start_method
    )


def _who(exc: BaseException, start_method: str | None) -> str:
    context = exc.conveyor_context  # type: ignore[attr-defined]
    if start_method is None:
        assert (context.worker_id, context.pid) == (None, None)
        return "(main process, num_workers=0)"
    return f"worker {context.worker_id} (pid {context.pid})"


@pytest.mark.parametrize("start_method", [None, "fork", "forkserver", "thread"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_note_names_the_sample_that_raised(case: str, start_method: str | None) -> None:
    dataset, batch_size, error, seq, where, culprit = CASES[case]

    exc, after = _first_error(_loader(dataset, batch_size, start_method), error)

    assert type(exc) is error  # `except KeyError` still catches it
    assert after == -(-len(dataset) // batch_size) - seq - 1  # the rest of the epoch came
    notes = exc.__notes__
    assert len(notes) == 1, notes
    lines = notes[0].splitlines()
    assert lines[0] == f"Raised in DataLoader {_who(exc, start_method)} during {where}."
    context = exc.conveyor_context  # type: ignore[attr-defined]
    assert (context.seq, context.culprit) == (seq, culprit)
    if start_method is None:
        assert lines[1:] == []  # the traceback is the exception's own
    else:
        assert lines[1] == "Worker traceback (most recent call last):"


@pytest.mark.parametrize("start_method", [None, "fork", "forkserver", "thread"])
def test_an_iterable_datasets_error_names_the_item_in_its_stream(start_method: str | None) -> None:
    exc, _ = _first_error(_loader(Shards(), 4, start_method), OSError)

    assert type(exc) is OSError
    context = exc.conveyor_context  # type: ignore[attr-defined]
    if start_method is None:
        position, stream = 37, "the dataset's"  # items 36-39 make batch 9
    else:
        position, stream = 18, "worker 1's"  # its items 1, 3, ..., 37: its 5th batch
    assert context.culprit == Culprit(stream_item=position)
    assert context.seq == 9  # worker 1 makes batches 1, 3, 5, 7, 9
    assert exc.__notes__[0].splitlines()[0] == (
        f"Raised in DataLoader {_who(exc, start_method)} during fetch of item {position} of "
        f"{stream} stream (counted from the epoch's start), for batch 9."
    )


@pytest.mark.parametrize("start_method", [None, "fork", "thread"])
def test_an_error_past_the_skip_budget_names_its_sample(start_method: str | None) -> None:
    loader = _loader(Labels(), 64, start_method)
    loader.on_error, loader.max_errors = "skip", 0

    with pytest.raises(KeyError) as info:
        list(loader)

    first, budget = info.value.__notes__
    assert first.splitlines()[0] == (
        f"Raised in DataLoader {_who(info.value, start_method)} during fetch of dataset "
        f"index 77, in {BATCH_64}."
    )
    assert "on_error='skip' gave up" in budget
