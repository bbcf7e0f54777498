"""``load_state_dict`` with a state it cannot resume from: a named ValueError, at once
(or, for a worker-count mismatch, at ``iter()``, as torchdata raises it)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from conveyor import DataLoader
from conveyor.errors import StateError, WorkerCountError

from .datasets import Counting, Draws

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def _state(num_workers: int = 0, dataset: Any = None, steps: int = 2) -> dict[str, Any]:
    loader = DataLoader(
        dataset if dataset is not None else Draws(12), batch_size=2, num_workers=num_workers
    )
    it = iter(loader)
    for _ in range(steps):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    return state


@pytest.mark.parametrize("bad", [None, [1, 2], "state", 3])
def test_a_state_must_be_a_dict(bad: Any) -> None:
    with pytest.raises(StateError, match="expects the dict that state_dict") as info:
        DataLoader(Draws(12)).load_state_dict(bad)
    assert isinstance(info.value, ValueError)


def test_a_missing_key_is_named() -> None:
    state = _state()
    del state["_sampler_iter_yielded"]
    with pytest.raises(StateError, match=r"state\['_sampler_iter_yielded'\] is missing"):
        DataLoader(Draws(12), batch_size=2).load_state_dict(state)
    state = _state(num_workers=1)
    del state["_snapshot"]["_main_snapshot"]["_num_workers"]
    with pytest.raises(StateError, match=r"\['_main_snapshot'\]\['_num_workers'\] is missing"):
        DataLoader(Draws(12), batch_size=2, num_workers=1).load_state_dict(state)


def test_neither_layout_is_named() -> None:
    with pytest.raises(StateError, match=r"neither 'dataset_state'.*nor '_snapshot'"):
        DataLoader(Draws(12)).load_state_dict({"epoch": 3})


def test_a_wrong_value_type_is_named() -> None:
    state = _state()
    state["_num_yielded"] = "two"
    with pytest.raises(StateError, match=r"state\['_num_yielded'\] should be a int, got 'two'"):
        DataLoader(Draws(12), batch_size=2).load_state_dict(state)


def test_an_unknown_version_is_refused() -> None:
    state = _state()
    state["conveyor"]["version"] = 99
    with pytest.raises(StateError, match=r"\['version'\] is 99; this conveyor reads version 1"):
        DataLoader(Draws(12), batch_size=2).load_state_dict(state)


def test_a_dataset_of_another_length_is_refused() -> None:
    state = _state()
    with pytest.raises(StateError, match="'dataset_len'\\] is 12 but the dataset now has 13"):
        DataLoader(Draws(13), batch_size=2).load_state_dict(state)


def test_an_iterable_dataset_resumes_only_with_its_worker_count() -> None:
    state = _state(num_workers=0, dataset=Counting())
    loader = DataLoader(Counting(), batch_size=2, num_workers=2)
    loader.load_state_dict(state)  # accepted: the count is checked where torchdata checks it
    with pytest.raises(WorkerCountError, match=r"num_workers=0 .* num_workers=2") as info:
        iter(loader)
    assert isinstance(info.value, AssertionError) and isinstance(info.value, ValueError)
    assert "Fix: use num_workers=0" in str(info.value)


def test_a_dataset_with_its_own_state_resumes_only_with_its_worker_count() -> None:
    class Stateful(Draws):
        def state_dict(self) -> dict[str, int]:
            return {"n": self.n}

        def load_state_dict(self, state: dict[str, int]) -> None:
            self.n = state["n"]

    state = _state(num_workers=0, dataset=Stateful(12))
    loader = DataLoader(Stateful(12), batch_size=2, num_workers=1)
    loader.load_state_dict(state)
    with pytest.raises(WorkerCountError, match="has state_dict"):
        iter(loader)


def test_state_dict_is_a_snapshot_and_load_then_save_is_equal() -> None:
    loader = DataLoader(Draws(12), batch_size=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    kept = copy.deepcopy(state)
    next(it)
    assert state == kept  # later iteration does not change a state already taken
    assert loader.state_dict() != kept
    again = DataLoader(Draws(12), batch_size=2)
    again.load_state_dict(kept)
    assert again.state_dict() == kept
    assert DataLoader(Draws(12)).load_state_dict({}) is None  # torchdata: empty changes nothing


def _torchdata_state(snapshot_step: int, since: int, batch_size: int) -> dict[str, Any]:
    """A state as torchdata's StatefulDataLoader writes it (torchdata 0.11), for a map-style
    dataset with 2 workers and a sequential sampler: its snapshot at ``snapshot_step``,
    ``since`` batches handed out after it."""
    worker = {"dataset_state": None, "fetcher_state": None}
    return {
        "_snapshot": {
            "_snapshot_step": snapshot_step,
            "_last_yielded_worker_id": (snapshot_step - 1) % 2,
            "_main_snapshot": {
                "_num_workers": 2,
                "_sampler_iter_state": {"samples_yielded": snapshot_step * batch_size},
                "_index_sampler_state": None,
                "_sampler_iter_yielded": snapshot_step,
                "_IterableDataset_len_called": None,
                "_shared_seed": None,
                "_base_seed": 1234,
            },
            "_worker_snapshots": {"worker_0": worker, "worker_1": worker},
        },
        "_steps_since_snapshot": since,
        "_iterator_finished": False,
    }


@pytest.mark.parametrize(("workers", "step", "since"), [(2, 3, 0), (2, 1, 2), (0, 2, 1)])
def test_a_state_torchdata_wrote_resumes_where_it_would(
    workers: int, step: int, since: int
) -> None:
    loader = DataLoader(Draws(12), batch_size=2, num_workers=workers)
    loader.load_state_dict(_torchdata_state(step, since, batch_size=2))
    indices = [batch[0].tolist() for batch in loader]
    assert indices == [[i, i + 1] for i in range(2 * (step + since), 12, 2)]


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("ended", [False, True])
def test_a_missing_iterator_finished_is_named(workers: int, ended: bool) -> None:
    # Read as False, the key's absence silently made a state taken after the epoch
    # ended resume into an empty epoch.
    loader = DataLoader(Draws(12), batch_size=2, num_workers=workers)
    if ended:
        assert len(list(loader)) == 6
        state = json.loads(json.dumps(loader.state_dict()))
        assert state["_iterator_finished"] is True
    else:
        state = _state(num_workers=workers)
    del state["_iterator_finished"]
    again = DataLoader(Draws(12), batch_size=2, num_workers=workers)
    with pytest.raises(StateError, match=r"state\['_iterator_finished'\] is missing") as info:
        again.load_state_dict(state)
    assert "empty epoch" in str(info.value)
