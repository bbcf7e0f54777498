"""Ray workers' parts that need no cluster: options and their errors at construction,
Ray missing, how the driver reads a worker's status from the calls it made, how a
lost actor is described, and batches through the object store's transport (with Ray's
read-only arrays standing in as read-only NumPy arrays). Runs without Ray installed."""

from __future__ import annotations

import importlib.util
import pickle
import warnings
from typing import Any

import numpy as np
import pytest
from tests.helpers.tables import Restarted, dispatch, loop

from conveyor import ConfigError, DataLoader, MissingDependencyError
from conveyor._task.protocol import Died, Stage, Task, WorkerStatus
from conveyor._transport.object_store import ObjectStoreBatch, ObjectStoreEncoder, StorePayload
from conveyor._workers import ray_cluster
from conveyor._workers.ray_pool import _Remote

HAS_RAY = importlib.util.find_spec("ray") is not None


# --- at construction ----------------------------------------------------------------------


def test_without_ray_the_loader_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    with pytest.raises(MissingDependencyError, match=r"pip install 'ray==2\.60\.0'") as caught:
        DataLoader(range(4), num_workers=2, worker_method="ray")
    assert isinstance(caught.value, ImportError)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"worker_options": {"num_cpus": 2}}, "need worker_method='ray'"),
        ({"worker_method": "ray", "worker_options": {"max_restarts": 2}}, "max_worker_restarts"),
        ({"worker_method": "ray", "worker_options": {"max_concurrency": 4}}, "one at a time"),
        ({"worker_method": "ray", "worker_options": [("num_cpus", 1)]}, "a mapping"),
        ({"worker_method": "ray", "multiprocessing_context": "spawn"}, "Ray starts"),
        ({"worker_method": "rays"}, "'ray' in an actor on a Ray cluster"),
        ({"worker_method": "ray", "num_workers": "auto"}, "Give num_workers as a count"),
    ],
    ids=[
        "options-without-ray",
        "max-restarts",
        "concurrency",
        "not-a-mapping",
        "context",
        "typo",
        "auto",
    ],
)
def test_bad_worker_options_are_refused_at_construction(kwargs: dict[str, Any], match: str) -> None:
    if kwargs.get("worker_method") == "ray" and not HAS_RAY:
        pytest.skip("Ray missing is refused first")
    kwargs = {"num_workers": 2, **kwargs}
    with pytest.raises(ConfigError, match=match):
        DataLoader(range(4), **kwargs)


@pytest.mark.skipif(not HAS_RAY, reason="needs Ray installed (not a cluster)")
def test_options_ray_refuses_are_a_config_error_naming_them() -> None:
    with pytest.raises(ConfigError, match=r"num_cpus.*Ray refused them"):
        ray_cluster.actor_class(object, {"num_cpus": "two"})


class _FakeRay:
    """Stands in for the ray module: a cluster of 3 CPUs and 2 "decode" slots."""

    @staticmethod
    def cluster_resources() -> dict[str, float]:
        return {"CPU": 3.0, "decode": 2.0, "memory": 1e9}


@pytest.mark.parametrize(
    ("options", "workers", "said"),
    [
        (None, 3, None),
        (None, 4, "1 of the DataLoader's 4 Ray workers cannot be placed: each asks for "
         "{'CPU': 1.0}, and the whole cluster has {'CPU': 3.0}"),
        ({"num_cpus": 0.5}, 6, None),
        ({"num_cpus": 0, "resources": {"decode": 1}}, 3, "1 of the DataLoader's 3"),
        ({"resources": {"gpu_box": 1}}, 2, "2 of the DataLoader's 2"),
        ({"placement_group": object()}, 9, None),  # Ray's to place
    ],
    ids=["fits", "one-cpu-short", "halves", "custom-resource", "nowhere", "placement-group"],
)  # fmt: skip
def test_workers_the_whole_cluster_cannot_hold_are_named(
    monkeypatch: pytest.MonkeyPatch, options: Any, workers: int, said: str | None
) -> None:
    monkeypatch.setattr(ray_cluster, "ray_module", lambda: _FakeRay)
    found = ray_cluster.shortfall(options, workers)
    if said is None:
        assert found is None
    else:
        assert found is not None and found.startswith(said)


# --- the status the driver reads from its calls ---------------------------------------------


def _task(seq: int, trace: bool = False) -> Task:
    return Task(0, seq, [2 * seq, 2 * seq + 1], trace=trace)


def test_a_worker_not_started_is_starting_since_its_actor_was_made() -> None:
    remote = _Remote(0, actor=None, now=10.0, started_key=b"started")
    assert remote.status(12.5) == WorkerStatus(-1, -1, Stage.STARTUP, -1, 2.5)


def test_the_running_task_is_the_oldest_unanswered_since_it_could_begin() -> None:
    """An actor runs its calls in order: its first unanswered task runs, since it was
    sent or since the one before it answered, whichever came last."""
    from conveyor._workers.ray_pool import _Call

    remote = _Remote(0, actor=None, now=0.0, started_key=b"started")
    remote.started, remote.last_reply_at = True, 5.0
    assert remote.status(7.0) == WorkerStatus(-1, -1, None, -1, 2.0)  # idle for 2 s
    remote.calls.extend([_Call("a", _task(3), sent_at=4.0), _Call("b", _task(4), 4.5)])
    assert remote.status(9.0) == WorkerStatus(0, 3, Stage.FETCH, -1, 4.0)  # since 5.0
    remote.last_reply_at = 3.0
    assert remote.status(9.0).age_s == 5.0  # since it was sent


def test_a_traced_task_names_its_sample_from_the_trace_board() -> None:
    from conveyor._workers.ray_pool import _Call

    remote = _Remote(0, actor=None, now=0.0, started_key=b"started")
    remote.started = True
    remote.calls.append(_Call("a", _task(3, trace=True), sent_at=1.0))
    assert remote.status(2.0, trace=(0, 3, 1)).position == 1
    assert remote.status(2.0, trace=(0, 2, 1)).position == -1  # another task's trace
    assert remote.status(2.0, trace=None).position == -1


# --- a lost actor, in words -------------------------------------------------------------------


def _ray_error(kind: str, text: str) -> BaseException:
    return type(kind, (Exception,), {})(text)


@pytest.mark.parametrize(
    ("kind", "text", "said"),
    [
        (
            "ActorDiedError",
            "The actor died unexpectedly before finishing this task.\n\tpid: 7\n"
            "The actor died because its node has died. Node Id: abc",
            "its node was lost",
        ),
        (
            "ActorDiedError",
            "The actor died unexpectedly.\nThe actor is dead because it was killed by `ray.kill`.",
            "killed with ray.kill()",
        ),
        (
            "ActorDiedError",
            "The actor died unexpectedly.\nThe actor is dead because its worker process has "
            "died. Worker exit type: SYSTEM_ERROR",
            "its process died (Ray does not say how",
        ),
        ("ActorUnavailableError", "The actor abc is unavailable: RpcError", "could not reach"),
        ("ObjectLostError", "Failed to retrieve object", "reply was lost"),
    ],
    ids=["node", "ray-kill", "process", "unavailable", "object-lost"],
)
def test_a_lost_actor_is_described_with_rays_own_sentence(kind: str, text: str, said: str) -> None:
    words = ray_cluster.describe_loss(_ray_error(kind, text))
    assert said in words and f"Ray: {kind}: " in words
    if "because" in text:
        assert text.splitlines()[-1].strip() in words


def test_an_actor_that_cannot_be_made_is_a_start_up_failure_not_a_death() -> None:
    assert ray_cluster.is_startup_failure(_ray_error("RuntimeEnvSetupError", "pip failed"))
    init = _ray_error("ActorDiedError", "creation task")
    init.actor_init_failed = True  # type: ignore[attr-defined]
    assert ray_cluster.is_startup_failure(init)
    assert not ray_cluster.is_startup_failure(_ray_error("ActorDiedError", "node died"))


def test_a_death_of_unknown_end_is_weak_evidence_as_a_kill_from_outside() -> None:
    """A single-sample task whose Ray worker died three times, the last two alone: then
    it is the sample's doing (a death of its own would take two, one alone), recorded as
    "killed", not proven poison for later epochs; Ray's words are the report's."""
    world = loop(workers=1, prefetch=1, on_error="skip", max_worker_restarts=9)
    dispatch(world.book, [[5]])
    cause = "its node was lost. Ray: ActorDiedError: gone"
    death = Died(0, 42, None, WorkerStatus(0, 0, Stage.FETCH, -1, 0.1), cause=cause)
    reports = []
    for now in (1.0, 2.0, 3.0):
        decision = world.die(death, now)
        assert isinstance(decision, Restarted)
        reports.append(decision.report)
    assert all("its node was lost" in r and "still running" not in r for r in reports)
    assert "restart 2 of 9" in reports[1]  # two deaths: not proven yet
    assert "not counted against max_worker_restarts: the sample is the cause" in reports[2]
    (note,) = world.book.view.entry(0).left_out
    assert (note.index, note.stage) == (5, "killed") and world.book.view.entry(0).exclude == (5,)


# --- batches through the object store ------------------------------------------------------


def _as_ray_returns_it(payload: StorePayload) -> StorePayload:
    """Ray hands the arrays out as read-only views of its store's memory."""
    buffers = []
    for b in payload.buffers:
        copy = b.copy()
        copy.flags.writeable = False
        buffers.append(copy)
    return StorePayload(payload.meta, tuple(buffers))


def test_a_batch_of_arrays_comes_back_writable_without_a_copy() -> None:
    encoder = ObjectStoreEncoder()
    batch = {"image": np.arange(24, dtype=np.uint8).reshape(2, 3, 4), "label": np.array([1, 2])}
    payload = _as_ray_returns_it(encoder.encode(batch))
    handle = ObjectStoreBatch(payload)
    assert handle.nbytes == len(payload.meta) + 24 + 16
    got = handle.open()
    assert got["image"].tolist() == batch["image"].tolist() and got["label"].tolist() == [1, 2]
    assert got["image"].flags.writeable
    store = payload.buffers[0]
    assert got["image"].__array_interface__["data"][0] == store.ctypes.data  # in place
    got["image"][0, 0, 0] = 99
    assert store[0] == 99  # the same memory


def test_tensors_come_back_as_writable_tensors_without_a_warning() -> None:
    torch = pytest.importorskip("torch")
    encoder = ObjectStoreEncoder()
    batch = [torch.arange(6).reshape(2, 3), torch.ones(2, dtype=torch.bool)]
    handle = ObjectStoreBatch(_as_ray_returns_it(encoder.encode(batch)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = handle.open()
        got[0] += 1
    assert got[0].tolist() == [[1, 2, 3], [4, 5, 6]] and got[1].tolist() == [True, True]


def test_numpy_leaves_standing_for_tensors_become_tensors_in_the_driver() -> None:
    """A worker that deferred torch sends NumPy arrays marked as tensors."""
    torch = pytest.importorskip("torch")
    encoder = ObjectStoreEncoder()
    encoder.arrays_as_tensors = True
    handle = ObjectStoreBatch(_as_ray_returns_it(encoder.encode([np.ones(3, np.float32)])))
    (tensor,) = handle.open()
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32


def test_an_empty_array_and_a_batch_without_arrays_travel_too() -> None:
    encoder = ObjectStoreEncoder()
    payload = _as_ray_returns_it(encoder.encode({"empty": np.zeros(0), "names": ["a", "b"]}))
    got = ObjectStoreBatch(payload).open()
    assert got["empty"].shape == (0,) and got["names"] == ["a", "b"]
    assert pickle.loads(pickle.dumps(payload)).meta == payload.meta  # Ray pickles it


# --- a cluster that stops answering -------------------------------------------------------


class _SilentRay:
    """A Ray whose replies never come (its head node is gone)."""

    def __init__(self) -> None:
        self.shut_down = False

    def is_initialized(self) -> bool:
        return True

    def wait(
        self, refs: list[Any], num_returns: int, timeout: float
    ) -> tuple[list[Any], list[Any]]:
        return [], refs

    def shutdown(self) -> None:
        self.shut_down = True


def _silent_pool(heard_ago: float) -> tuple[Any, _SilentRay]:
    import time

    from conveyor._workers.ray_pool import RayPool

    ray = _SilentRay()
    pool = object.__new__(RayPool)  # no cluster: only what wait() reads
    pool._ray, pool._waiting, pool._cluster_lost = ray, {"reply": None}, False
    pool._heard_at = time.monotonic() - heard_ago
    return pool, ray


def test_the_head_is_asked_once_nothing_came_for_a_while_however_short_the_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from conveyor import ClusterLostError
    from conveyor._workers import ray_pool

    monkeypatch.setattr(ray_cluster, "unreachable", lambda: "its head node did not answer")
    pool, _ = _silent_pool(heard_ago=0.0)
    assert pool.wait(0.0) == []  # heard from just now: not asked yet
    pool, ray = _silent_pool(heard_ago=ray_pool.PROBE_EVERY_S)
    with pytest.raises(ClusterLostError, match=r"its head node did not answer.*state_dict"):
        pool.wait(0.0)  # a loop waking for its deadlines still finds out
    assert ray.shut_down  # so that Ray does not end this process in a minute


class _Preempted(Exception):
    """What a training script's own signal handler raises."""


class _InterruptedRay(_SilentRay):
    """A Ray whose wait a signal handler interrupted: Ray 2.60's C code returns with the
    handler's exception pending, which CPython reports as a SystemError caused by it."""

    def wait(
        self, refs: list[Any], num_returns: int, timeout: float
    ) -> tuple[list[Any], list[Any]]:
        raise SystemError(
            "<cyfunction CoreWorker.wait at 0x7f92f1a045f0> returned a result with an exception set"
        ) from _Preempted("SIGTERM: save and exit")


def test_a_signal_handlers_exception_in_rays_wait_is_raised_as_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not as the cluster lost (the head node is not even asked)."""
    asked: list[bool] = []
    monkeypatch.setattr(ray_cluster, "unreachable", lambda: asked.append(True))
    pool, _ = _silent_pool(heard_ago=0.0)
    pool._ray = _InterruptedRay()
    with pytest.raises(_Preempted, match="save and exit"):
        pool.wait(1.0)
    assert not asked


def test_a_system_error_of_rays_own_is_not_taken_for_a_handlers() -> None:
    own = SystemError("an unexpected system state has occurred")
    own.__cause__ = ValueError("inside Ray")
    assert ray_cluster.interrupting_error(own) is None
    assert ray_cluster.interrupting_error(RuntimeError("gone")) is None
