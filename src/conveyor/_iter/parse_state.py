"""Reading a state back: ``load_state_dict``'s side of the layout in :mod:`.state`.

:func:`parse` reads either of conveyor's layouts, or a state torchdata wrote, into one
:class:`~.state.ResumePoint`, and checks every key on the way: a state that cannot be
resumed raises a StateError naming the first key that is missing or wrong, at
``load_state_dict``, not at the next ``iter()``.
"""

from __future__ import annotations

from typing import Any

from .._task.dataset_calls import DatasetCall
from .._task.dataset_state import (
    DATASET_STATE,
    ENDED,
    FETCHER_STATE,
    ITER_STATE,
    WorkerState,
)
from ..errors import StateError
from ..records import SkippedSample
from .elastic import RANKS, read_part
from .state import (
    CALLS,
    CONVEYOR,
    FINISHED,
    MAIN,
    SAMPLER_KEYS,
    SNAPSHOT,
    VERSION,
    WORKERS,
    ResumePoint,
    worker_key,
)

__all__ = ["parse"]


def parse(state: Any, *, dataset_len: int | None, iterable: bool) -> ResumePoint:
    """Read a state written by conveyor (either layout) or torchdata; a StateError names
    the first key that is missing or wrong."""
    if not isinstance(state, dict):
        raise StateError(
            f"load_state_dict expects the dict that state_dict() returned, got "
            f"{type(state).__name__}: {state!r:.80}"
        )
    own = state.get(CONVEYOR)
    if own is not None:
        _check_own(own, dataset_len)
    if DATASET_STATE in state:
        return _parse_inline(state, own, iterable)
    if SNAPSHOT in state:
        return _parse_workers(state, own, iterable)
    raise StateError(
        "load_state_dict: the state has neither 'dataset_state' (a state taken without "
        "workers) nor '_snapshot' (taken with workers); expected the dict state_dict() "
        f"returned, got keys {sorted(map(str, state))}"
    )


def _check_own(own: Any, dataset_len: int | None) -> None:
    if not isinstance(own, dict):
        raise StateError(f"state['conveyor'] should be a dict, got {type(own).__name__}")
    version = own.get("version")
    if version != VERSION:
        raise StateError(
            f"state['conveyor']['version'] is {version!r}; this conveyor reads version "
            f"{VERSION}. The state was written by another conveyor release: resume with that "
            "release, or start the epoch afresh."
        )
    saved_len = own.get("dataset_len")
    if saved_len is not None and dataset_len is not None and saved_len != dataset_len:
        raise StateError(
            f"state['conveyor']['dataset_len'] is {saved_len} but the dataset now has "
            f"{dataset_len} samples. Positions in the state would name other samples, so "
            "it cannot be resumed: load it with the dataset it was taken with."
        )
    for key in ("epoch", "samples"):
        _need_int(own, key, f"state['conveyor']['{key}']")


def _parse_inline(state: dict[str, Any], own: Any, iterable: bool) -> ResumePoint:
    where = "state"
    drawn = _need_int(state, "_sampler_iter_yielded", f"{where}['_sampler_iter_yielded']")
    yielded = _need_int(state, "_num_yielded", f"{where}['_num_yielded']")
    inline = _worker_state(state, where, iterable)
    replay = 0
    if iterable and not inline.holds_state:  # run the epoch again, dropping what was out
        replay, drawn, inline = yielded, 0, WorkerState(iterable=True)
    return _point(
        state,
        own,
        num_workers=0,
        drawn=drawn,
        yielded=yielded,
        replay=replay,
        main={k: state.get(k) for k in SAMPLER_KEYS},
        base_seed=None,
        workers=(inline,),
        last_worker=-1,
    )


def _parse_workers(state: dict[str, Any], own: Any, iterable: bool) -> ResumePoint:
    snapshot = _need(state, SNAPSHOT, dict, "state['_snapshot']")
    main = _need(snapshot, MAIN, dict, "state['_snapshot']['_main_snapshot']")
    num_workers = _need_int(
        main, "_num_workers", "state['_snapshot']['_main_snapshot']['_num_workers']"
    )
    step = _need_int(snapshot, "_snapshot_step", "state['_snapshot']['_snapshot_step']")
    since = _need_int(state, "_steps_since_snapshot", "state['_steps_since_snapshot']")
    last = _need(
        snapshot, "_last_yielded_worker_id", int, "state['_snapshot']['_last_yielded_worker_id']"
    )
    snaps = _need(snapshot, WORKERS, dict, "state['_snapshot']['_worker_snapshots']")
    expected = {worker_key(i) for i in range(num_workers)}
    if set(snaps) != expected:
        raise StateError(
            f"state['_snapshot']['_worker_snapshots'] has keys {sorted(snaps)}; with "
            f"_num_workers={num_workers} expected {sorted(expected)}"
        )
    workers = tuple(
        _worker_state(snaps[worker_key(i)], f"state[...]['{worker_key(i)}']", iterable)
        for i in range(num_workers)
    )
    holds = any(w.holds_state for w in workers)
    drawn = _need_int(main, "_sampler_iter_yielded", "state[...]['_sampler_iter_yielded']")
    if iterable and not holds:
        # Without a state of its own, an iterable dataset resumes by running the epoch
        # again from its start and dropping what was handed out.
        replay, drawn, last = step + since, 0, -1
        workers = tuple(WorkerState(iterable=True) for _ in workers)
    elif iterable:
        replay = since  # the iterators' states are those of the snapshot step
    elif holds:
        replay = since  # the datasets' states are those of the snapshot step
    else:
        drawn, replay = drawn + since, 0  # nothing to fetch again: skip the indices
    base_seed = main.get("_base_seed")
    return _point(
        state,
        own,
        num_workers=num_workers,
        drawn=drawn,
        yielded=step + since,
        replay=replay,
        main={k: main.get(k) for k in SAMPLER_KEYS},
        base_seed=base_seed if isinstance(base_seed, int) else None,
        workers=workers,
        last_worker=last,
    )


def _point(
    state: dict[str, Any],
    own: Any,
    *,
    num_workers: int,
    drawn: int,
    yielded: int,
    replay: int,
    main: dict[str, Any],
    base_seed: int | None,
    workers: tuple[WorkerState, ...],
    last_worker: int,
) -> ResumePoint:
    if FINISHED not in state:
        raise StateError(
            f"state['{FINISHED}'] is missing from the state (was it made by state_dict()?). "
            "It says whether the epoch had ended when the state was taken; guessed wrong, "
            "the resumed loader would yield an empty epoch or repeat one."
        )
    finished = state[FINISHED]
    if not isinstance(finished, bool):
        raise StateError(f"state['{FINISHED}'] should be True or False, got {finished!r}")
    own = own or {}
    main = {**main, "rng": own.get("rng") or [], "global_rng": own.get("global_rng")}
    beyond = own.get("delivered_beyond") or []
    if not isinstance(beyond, list) or not all(isinstance(s, int) for s in beyond):
        raise StateError(
            "state['conveyor']['delivered_beyond'] should be a list of batch positions, got "
            f"{beyond!r:.80}"
        )
    if own.get("base_seed") is not None:
        base_seed = own["base_seed"]
    return ResumePoint(
        num_workers=num_workers,
        finished=finished,
        epoch=own.get("epoch"),
        delivered=drawn,
        beyond=frozenset(beyond),
        samples=own.get("samples"),
        yielded=yielded,
        replay=replay,
        main=main,
        base_seed=base_seed,
        workers=workers,
        last_worker=last_worker,
        skipped=tuple(_skip_from(d) for d in own.get("skipped") or []),
        rng_after=own.get("rng_after"),
        global_after=own.get("global_after"),
        raw=state,
        ranks=_ranks(own),
        world=_world(own.get("world")),
        calls=_calls(own.get(CALLS)),
    )


def _calls(raw: Any) -> tuple[DatasetCall, ...]:
    """The dataset's calls a state keeps (see state.CALLS); a StateError naming the key."""
    where = f"state['conveyor']['{CALLS}']"
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise StateError(f"{where} should be a list of calls, got {raw!r:.80}")
    calls = []
    for i, call in enumerate(raw):
        if not (
            isinstance(call, dict)
            and isinstance(call.get("name"), str)
            and isinstance(call.get("args"), list)
            and isinstance(call.get("kwargs"), dict)
            and all(isinstance(k, str) for k in call["kwargs"])
        ):
            raise StateError(
                f"{where}[{i}] should be {{'name': str, 'args': list, 'kwargs': dict}}, got "
                f"{call!r:.80}"
            )
        calls.append(DatasetCall(call["name"], tuple(call["args"]), tuple(call["kwargs"].items())))
    return tuple(calls)


def _world(raw: Any) -> tuple[int, int] | None:
    if raw is None:
        return None
    if not (isinstance(raw, list) and len(raw) == 2 and all(isinstance(v, int) for v in raw)):
        raise StateError(f"state['conveyor']['world'] should be [world size, rank], got {raw!r}")
    return raw[0], raw[1]


def _ranks(own: dict[str, Any]) -> dict[str, Any] | None:
    raw = own.get(RANKS)
    if raw is not None:
        read_part(raw)  # a malformed part fails at load_state_dict, naming its key
    return raw


def _worker_state(part: Any, where: str, iterable: bool) -> WorkerState:
    if not isinstance(part, dict):
        raise StateError(f"{where} should be a dict, got {type(part).__name__}")
    if DATASET_STATE not in part or FETCHER_STATE not in part:
        raise StateError(f"{where} needs the keys 'dataset_state' and 'fetcher_state'")
    fetcher = part[FETCHER_STATE]
    if fetcher is None:
        return WorkerState(part[DATASET_STATE], iterable=iterable)
    if not isinstance(fetcher, dict) or ITER_STATE not in fetcher:
        raise StateError(f"{where}['fetcher_state'] should hold 'dataset_iter_state'")
    return WorkerState(
        part[DATASET_STATE], fetcher[ITER_STATE], bool(fetcher.get(ENDED, False)), True
    )


def _skip_from(d: Any) -> SkippedSample:
    if not isinstance(d, dict):
        raise StateError(f"state['conveyor']['skipped'] holds {d!r:.60}, not a record")
    try:
        index = d["index"]
        return SkippedSample(
            tuple(index) if isinstance(index, list) else index,
            int(d["epoch"]),
            d["worker_id"],
            str(d["stage"]),
            str(d["exception_type"]),
            str(d["message"]),
        )
    except KeyError as missing:
        raise StateError(f"state['conveyor']['skipped']: a record lacks {missing}") from None


def _need(d: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in d:
        raise StateError(f"{where} is missing from the state (was it made by state_dict()?)")
    value = d[key]
    if not isinstance(value, kind):
        raise StateError(f"{where} should be a {kind.__name__}, got {value!r:.80}")
    return value


def _need_int(d: dict[str, Any], key: str, where: str) -> int:
    value = _need(d, key, int, where)
    if isinstance(value, bool) or value < 0:
        raise StateError(f"{where} should be a count >= 0, got {value!r}")
    return int(value)
