"""The training loop's calls on the dataset between epochs (``set_epoch``, ``epoch_calls``):
how the main process records them (on the instance, never its class), what a copy of the
dataset holds, what the loop sends its workers and when, and what a state keeps.

Real workers of every kind are in tests/integration/test_epoch_calls.py, a replacement
after a real SIGKILL in tests/faults/test_epoch_calls_after_a_crash.py.
"""

from __future__ import annotations

import copy
import inspect
import json
import pickle
from typing import Any

import cloudpickle
import pytest
from tests.helpers.fake_pool import FakePool

from conveyor import ConfigError, DataLoader, StateError
from conveyor._iter.multiprocess import MultiprocessIterator
from conveyor._iter.parse_state import parse
from conveyor._task.dataset_calls import (
    CallLog,
    DatasetCall,
    Forwarder,
    calls_of,
    detach,
    log_of,
    replay,
    unwatched_names,
    watch,
)


class Epochs:
    """dataset[i] == (the epoch it was told, i)."""

    def __init__(self, n: int = 8) -> None:
        self.n = n
        self.epoch = 0
        self.level = 0

    def set_epoch(self, epoch: int) -> None:
        """Shuffle by epoch."""
        if epoch < 0:
            raise ValueError(f"epoch {epoch} < 0")
        self.epoch = epoch

    def set_level(self, level: int, *, hard: bool = False) -> None:
        self.level = level + (10 if hard else 0)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        return self.epoch, i


class Slotted:
    __slots__ = ("epoch",)

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class Forwards:
    """A wrapper whose methods come through ``__getattr__``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class Odd:
    """set_epoch as an instance attribute, set_level as a property."""

    def __init__(self) -> None:
        self.set_epoch = lambda epoch: None

    @property
    def set_level(self) -> Any:
        return lambda level: None


NAMES = ("set_epoch", "set_level")


# --- recording on the main process's object -----------------------------------------------


def test_a_watched_call_is_made_then_recorded_on_the_instance_only() -> None:
    dataset, other = Epochs(), Epochs()
    function = Epochs.__dict__["set_epoch"]
    log = watch(dataset, NAMES)
    assert log is not None and log_of(dataset) is log
    dataset.set_epoch(3)
    assert dataset.epoch == 3
    assert log.calls(NAMES) == (DatasetCall("set_epoch", (3,)),)
    # The class, and every other instance, are as they were.
    assert Epochs.__dict__["set_epoch"] is function
    assert "set_epoch" not in vars(other) and log_of(other) is None
    other.set_epoch(5)
    assert log.serial == 1 and other.epoch == 5


def test_the_log_keeps_the_last_call_of_each_method_in_the_order_made() -> None:
    dataset = Epochs()
    log = watch(dataset, NAMES)
    assert log is not None
    dataset.set_epoch(1)
    dataset.set_level(2, hard=True)
    dataset.set_epoch(3)
    assert [str(c) for c in log.calls(NAMES)] == ["set_level(2, hard=True)", "set_epoch(3)"]
    assert log.calls(["set_epoch"]) == (DatasetCall("set_epoch", (3,)),)
    assert log.serial == 3 and dataset.level == 12


def test_a_call_that_raises_is_not_recorded() -> None:
    dataset = Epochs()
    log = watch(dataset, NAMES)
    assert log is not None
    with pytest.raises(ValueError, match="epoch -1 < 0"):
        dataset.set_epoch(-1)
    assert log.calls(NAMES) == () and log.serial == 0


def test_watching_twice_shares_one_log_and_adds_names() -> None:
    dataset = Epochs()
    first = watch(dataset, ["set_epoch"])
    assert watch(dataset, NAMES) is first
    dataset.set_level(4)
    assert first is not None and first.calls(NAMES) == (DatasetCall("set_level", (4,)),)


def test_the_method_still_looks_like_itself() -> None:
    dataset = Epochs()
    watch(dataset, NAMES)
    assert inspect.signature(dataset.set_epoch) == inspect.signature(Epochs().set_epoch)
    assert dataset.set_epoch.__doc__ == "Shuffle by epoch."
    assert "Epochs.set_epoch" in repr(dataset.set_epoch)


def test_what_cannot_be_watched_is_left_alone_and_named() -> None:
    assert watch(Slotted(), NAMES) is None
    forwarding = Forwards(Epochs())
    assert watch(forwarding, NAMES) is None and "set_epoch" not in vars(forwarding)
    odd = Odd()
    instance_attribute = odd.set_epoch
    assert watch(odd, NAMES) is None and odd.set_epoch is instance_attribute
    assert watch(Epochs(), ["no_such_method"]) is None
    assert unwatched_names(Slotted(), NAMES) == ("set_epoch",)
    assert unwatched_names(forwarding, NAMES) == NAMES
    assert unwatched_names(odd, NAMES) == NAMES
    watched = Epochs()
    watch(watched, NAMES)
    assert unwatched_names(watched, NAMES) == ()
    assert unwatched_names(Epochs(), ["no_such_method"]) == ()


# --- copies of the dataset ------------------------------------------------------------------


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_a_pickled_dataset_holds_the_real_method_bound_to_itself(dumps: Any) -> None:
    dataset = Epochs()
    watch(dataset, NAMES)
    dataset.set_epoch(2)
    data = dumps(dataset)
    assert b"conveyor" not in data  # a pickle of the user's holds nothing of conveyor's
    copied = pickle.loads(data)
    assert copied.epoch == 2 and log_of(copied) is None
    copied.set_epoch(7)
    assert (copied.epoch, dataset.epoch) == (7, 2)
    assert calls_of(dataset, NAMES) == (DatasetCall("set_epoch", (2,)),)


def test_a_deep_copy_holds_the_real_method_bound_to_itself() -> None:
    dataset = Epochs()
    watch(dataset, NAMES)
    copied = copy.deepcopy(dataset)
    copied.set_epoch(7)
    assert (copied.epoch, dataset.epoch) == (7, 0) and log_of(copied) is None


def test_a_detached_shallow_copy_makes_its_calls_on_itself() -> None:
    dataset = Epochs()
    log = watch(dataset, NAMES)
    assert log is not None
    shared = copy.copy(dataset)
    shared.set_epoch(4)  # a shallow copy shares the recorder: the original's call
    assert (shared.epoch, dataset.epoch) == (0, 4)
    copied = detach(copy.copy(dataset))
    copied.set_epoch(9)
    assert (copied.epoch, dataset.epoch, log.serial) == (9, 4, 1)
    assert "set_epoch" in vars(dataset)  # the original keeps its recorder


def test_a_replay_is_made_with_the_classes_method_and_never_recorded() -> None:
    dataset = Epochs()
    log = watch(dataset, NAMES)
    assert log is not None
    shallow = copy.copy(dataset)  # it still holds the original's recorder
    replay(
        shallow, (DatasetCall("set_level", (1,), (("hard", True),)), DatasetCall("set_epoch", (5,)))
    )
    assert (shallow.epoch, shallow.level) == (5, 11)
    assert (dataset.epoch, dataset.level, log.serial) == (0, 0, 0)


# --- what the loop sends ------------------------------------------------------------------


def test_the_forwarder_sends_the_last_calls_once_after_each_new_call() -> None:
    dataset = Epochs()
    watch(dataset, NAMES)
    dataset.set_epoch(0)
    forwarder = Forwarder(dataset, NAMES)
    assert forwarder.current == (DatasetCall("set_epoch", (0,)),)  # the workers start with it
    assert forwarder.news() is None
    dataset.set_level(3)
    dataset.set_epoch(1)
    assert forwarder.news() == (DatasetCall("set_level", (3,)), DatasetCall("set_epoch", (1,)))
    assert forwarder.news() is None
    dataset.set_epoch(1)  # the same again: sent again (a call was made)
    assert forwarder.news() == (DatasetCall("set_level", (3,)), DatasetCall("set_epoch", (1,)))
    assert Forwarder(Epochs(), NAMES).news() is None  # nothing watched


def _persistent(dataset: Any, **kwargs: Any) -> tuple[DataLoader, MultiprocessIterator, FakePool]:
    loader = DataLoader(
        dataset, batch_size=2, num_workers=2, persistent_workers=True, preflight=False, **kwargs
    )
    FakePool.instances.clear()
    it = MultiprocessIterator(loader._config, loader._history, pool_factory=FakePool)
    return loader, it, FakePool.instances[-1]


def _epochs(batches: list[Any]) -> set[int]:
    return {int(e) for batch in batches for e in batch[0]}


def test_the_loop_sends_calls_as_an_epoch_starts_and_keeps_them_for_replacements() -> None:
    dataset = Epochs(n=16)
    dataset.set_epoch(0)  # before the loader: in every copy already
    _, it, pool = _persistent(dataset)
    assert [s.calls for s in pool.specs] == [(), ()]
    assert _epochs(list(it)) == {0}
    it.reset()  # no call since: nothing sent
    assert _epochs(list(it)) == {0} and [s.calls for s in pool.specs] == [(), ()]
    dataset.set_epoch(2)
    it.reset()
    told = (DatasetCall("set_epoch", (2,)),)
    assert [s.calls for s in pool.specs] == [told, told]
    assert [s.calls for s in it._specs] == [told, told]  # where an added worker starts from
    assert [w.core.user.dataset.epoch for w in pool.workers] == [2, 2]
    first = next(it)
    dataset.set_epoch(7)  # mid-epoch: for the next epoch, not this one
    pool.kill_once[9] = -9  # the worker fetching sample 9 dies; its replacement takes over
    with pytest.warns(Warning, match="SIGKILL"):
        rest = list(it)
    assert pool.replaced, "a worker was replaced"
    assert _epochs([first, *rest]) == {2}
    it.reset()
    assert _epochs(list(it)) == {7}
    it.close()


def test_nothing_is_sent_or_kept_for_a_dataset_without_the_method() -> None:
    class Plain:
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> int:
            return i

    dataset = Plain()
    loader, it, pool = _persistent(dataset)
    assert vars(dataset) == {}
    list(it)
    it.reset()
    list(it)
    assert [s.calls for s in pool.specs] == [(), ()]
    assert "calls" not in loader.state_dict()["conveyor"]
    it.close()


# --- the state -------------------------------------------------------------------------------


def _resume_point(state: dict[str, Any]) -> Any:
    return parse(json.loads(json.dumps(state)), dataset_len=8, iterable=False)


def test_a_state_keeps_the_calls_the_epoch_began_with() -> None:
    dataset = Epochs()
    loader = DataLoader(dataset, batch_size=2, epoch_calls=NAMES)
    dataset.set_level(1)
    dataset.set_epoch(2)
    it = iter(loader)
    next(it)
    dataset.set_epoch(3)  # mid-epoch: not what this epoch's batches were made with
    state = loader.state_dict()
    assert state["conveyor"]["calls"] == [
        {"name": "set_level", "args": [1], "kwargs": {}},
        {"name": "set_epoch", "args": [2], "kwargs": {}},
    ]
    assert _resume_point(state).calls == (
        DatasetCall("set_level", (1,)),
        DatasetCall("set_epoch", (2,)),
    )
    list(it)  # the epoch ends: a state now is for the next epoch, with the last calls
    assert loader.state_dict()["conveyor"]["calls"][-1] == {
        "name": "set_epoch",
        "args": [3],
        "kwargs": {},
    }


def test_loading_a_state_makes_its_calls_on_the_dataset_and_records_them() -> None:
    dataset = Epochs()
    loader = DataLoader(dataset, batch_size=2)
    dataset.set_epoch(2)
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    fresh = Epochs()
    resumed = DataLoader(fresh, batch_size=2)
    resumed.load_state_dict(state)
    assert fresh.epoch == 2 and calls_of(fresh, ["set_epoch"]) == (DatasetCall("set_epoch", (2,)),)
    assert [int(e) for batch in resumed for e in batch[0]] == [2] * 6
    # A method the loader does not replay, or the dataset lacks, is left alone.
    state["conveyor"]["calls"] = [{"name": "set_level", "args": [5], "kwargs": {}}]
    other = Epochs()
    DataLoader(other, batch_size=2).load_state_dict(state)
    assert other.level == 0


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        ({"name": "set_epoch"}, "['calls'] should be a list of calls"),
        ([{"name": "set_epoch", "args": 2, "kwargs": {}}], "['calls'][0] should be"),
        ([{"args": [2], "kwargs": {}}], "['calls'][0] should be"),
        ([{"name": "set_epoch", "args": [], "kwargs": {1: 2}}], "['calls'][0] should be"),
    ],
)
def test_a_malformed_call_in_a_state_is_named(calls: Any, message: str) -> None:
    loader = DataLoader(Epochs(), batch_size=2)
    state = loader.state_dict()
    state["conveyor"]["calls"] = calls
    with pytest.raises(StateError) as raised:
        DataLoader(Epochs(), batch_size=2).load_state_dict(state)
    assert "state['conveyor']" + message in str(raised.value)


def test_a_state_without_calls_resumes_with_none() -> None:
    dataset = Epochs()
    state = DataLoader(dataset, batch_size=2).state_dict()
    assert "calls" not in state["conveyor"]  # none made: the state is as it always was
    assert _resume_point(state).calls == ()


# --- the option ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["set_epoch", 3, ["set epoch"], [None]])
def test_a_bad_epoch_calls_is_a_config_error_naming_it(value: Any) -> None:
    with pytest.raises(ConfigError, match="epoch_calls"):
        DataLoader(Epochs(), epoch_calls=value)


def test_epoch_calls_is_kept_as_a_tuple_and_followed_when_set() -> None:
    dataset = Epochs()
    loader = DataLoader(dataset, epoch_calls=["set_level"])
    assert loader.epoch_calls == ("set_level",)
    assert "set_epoch" not in vars(dataset) and "set_level" in vars(dataset)
    loader.epoch_calls = ("set_epoch", "set_level")
    assert loader._config.options.epoch_calls == ("set_epoch", "set_level")
    assert "set_epoch" in vars(dataset)
    assert isinstance(log_of(dataset), CallLog)
