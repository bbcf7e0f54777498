"""Where conveyor meets Ray: importing it, connecting, the workers' actor class, whether
the cluster is still there, how an actor was lost, and the trace side channel.

Ray is optional: it is imported here, and only when asked for, as a module object, so
nothing else of conveyor imports it and mypy sees Ray's objects as ``Any`` whether Ray
is installed or not. Two things reach past Ray's public API, both into the GCS client
of Ray 2.60 (``ray.experimental.internal_kv``), each wrapped here: a key-value read with
a timeout (is the head node still there?) and small key-value writes (a traced task's
position, see :class:`TraceBoard`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Mapping
from typing import Any

from .._torch import DEFER_ENV
from ..errors import ConfigError, MissingDependencyError

__all__ = [
    "INSTALL",
    "TraceBoard",
    "actor_class",
    "check_actor_options",
    "connect",
    "describe_loss",
    "interrupting_error",
    "is_startup_failure",
    "ray_module",
    "require_ray",
    "unreachable",
]

RAY_VERSION = "2.60.0"  # the version conveyor is tested with
INSTALL = f"pip install 'ray=={RAY_VERSION}'"
_NAMESPACE = b"conveyor"
KV_TIMEOUT_S = 5.0  # a GCS that does not answer a small read in this long is gone
# A trace is the only word of which sample a worker's death was at: it may wait for a
# GCS slowed by a loaded head node (a retry's samples are slow anyway), where the
# liveness probe must answer soon. On CI's busy cores a trace lost to the probe's 5 s
# made a poisoned sample's proof one death longer than the restart budget.
TRACE_TIMEOUT_S = 30.0

# What conveyor sets on each worker's actor, before the user's worker_options: a worker
# reserves one CPU (Ray's default for actors is none once placed, which would pack every
# worker on one node), and Ray restarts and retries nothing (conveyor does, exactly once).
_ACTOR_DEFAULTS: dict[str, Any] = {"num_cpus": 1, "max_restarts": 0, "max_task_retries": 0}


# Actor options that would break what conveyor promises: it restarts workers itself
# (exactly once, within max_worker_restarts), and a worker runs its tasks one at a time,
# in the order sent (an iterable dataset's batches follow that order).
_RAY_OPTIONS_KEPT = {
    "max_restarts": "conveyor replaces dead workers itself (max_worker_restarts)",
    "max_task_retries": "conveyor re-sends a dead worker's tasks itself, exactly once",
    "max_concurrency": "a worker runs its tasks one at a time, in the order sent",
    "concurrency_groups": "a worker runs its tasks one at a time, in the order sent",
    "lifetime": "a worker lives as long as its loader's iterator",
    "name": "each worker's actor is conveyor's own",
    "namespace": "each worker's actor is conveyor's own",
    "get_if_exists": "each worker's actor is conveyor's own",
}


def check_actor_options(options: Mapping[str, Any]) -> None:
    """``worker_options`` go to Ray as actor options (CPUs per worker, custom resources,
    a runtime environment): a mapping of option names. Ray checks the names and values
    it knows when the workers start; those that would break what conveyor promises are
    refused here."""
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise ConfigError(
            "worker_options must be a mapping of Ray actor option names to values, e.g. "
            f"{{'num_cpus': 2, 'runtime_env': {{'pip': ['pillow']}}}}, got {options!r}"
        )
    for key, why in _RAY_OPTIONS_KEPT.items():
        if key in options:
            raise ConfigError(
                f"worker_options[{key!r}] cannot be set: {why}. Drop it from worker_options."
            )


def require_ray() -> None:
    """Raise a :class:`MissingDependencyError` that says what to install, without
    importing Ray (that costs seconds; the loader imports it when its workers start)."""
    if importlib.util.find_spec("ray") is None:
        raise MissingDependencyError(
            "worker_method='ray' runs the workers on a Ray cluster, but Ray is not "
            f"installed in this environment. Install it: {INSTALL} (the same version on "
            "every node of the cluster), or use worker_method='multiprocessing'."
        )


def ray_module() -> Any:
    require_ray()
    return importlib.import_module("ray")


def connect() -> Any:
    """Ray, connected: as it is if this process already called ``ray.init()``, else as
    ``ray.init()`` connects (``RAY_ADDRESS``, the cluster last started on this machine,
    or a new local one, which stays up for the next loader)."""
    ray = ray_module()
    if not ray.is_initialized():
        ray.init()
    return ray


def actor_class(worker_class: type, options: Mapping[str, Any] | None) -> Any:
    """``worker_class`` as a Ray actor class with conveyor's options and the user's
    ``worker_options`` over them; an option Ray refuses is a ConfigError naming it.

    The actors defer importing torch, as spawned workers do (see conveyor._torch): it
    must be said in their environment, before they import conveyor, so it goes in their
    runtime environment's variables (Ray merges those with the job's)."""
    ray = ray_module()
    merged = {**_ACTOR_DEFAULTS, **(options or {})}
    runtime_env = dict(merged.get("runtime_env") or {})
    runtime_env["env_vars"] = {DEFER_ENV: "1", **(runtime_env.get("env_vars") or {})}
    merged["runtime_env"] = runtime_env
    try:
        return ray.remote(worker_class).options(**merged)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"worker_options={dict(options or {})!r}: Ray refused them: {exc}"
        ) from exc


def shortfall(options: Mapping[str, Any] | None, num_workers: int) -> str | None:
    """What is wrong, in words, if ``num_workers`` actors with these options ask for more
    than the whole cluster has (its alive nodes' totals; a placement group is left to
    Ray); None if they fit."""
    merged = {**_ACTOR_DEFAULTS, **(options or {})}
    strategy = type(merged.get("scheduling_strategy")).__name__
    if merged.get("placement_group") is not None or "PlacementGroup" in strategy:
        return None
    each = {"CPU": merged.get("num_cpus") or 0, "GPU": merged.get("num_gpus") or 0}
    each.update(merged.get("resources") or {})
    each = {name: float(amount) for name, amount in each.items() if amount}
    if not each:
        return None
    total = ray_module().cluster_resources()
    fit = min(int(total.get(name, 0.0) // amount) for name, amount in each.items())
    if fit >= num_workers:
        return None
    has = {name: total.get(name, 0.0) for name in each}
    return (
        f"{num_workers - fit} of the DataLoader's {num_workers} Ray workers cannot be placed: "
        f"each asks for {each}, and the whole cluster has {has}. They wait until nodes "
        "join (an autoscaler); without one, lower num_workers, or ask for less per worker "
        "(worker_options={'num_cpus': ...}). timeout= bounds the wait."
    )


def _gcs() -> Any:
    return importlib.import_module("ray.experimental.internal_kv").internal_kv_get_gcs_client()


def unreachable() -> str | None:
    """None if the cluster's head node answers a small read within KV_TIMEOUT_S; else
    what went wrong, in words."""
    ray = ray_module()
    if not ray.is_initialized():
        return "Ray was shut down in this process (ray.shutdown()) while the loader iterated"
    gcs = _gcs()
    if gcs is None:
        return "this process is not connected to a Ray cluster any more"
    try:
        gcs.internal_kv_get(b"conveyor-probe", _NAMESPACE, timeout=KV_TIMEOUT_S)
    except Exception as exc:  # RpcError, or whatever a broken connection raises
        return (
            f"its head node did not answer within {KV_TIMEOUT_S:g} s ({type(exc).__name__}: {exc})"
        )
    return None


def describe_loss(error: BaseException) -> str:
    """Why Ray says an actor (or its reply) was lost, in a sentence: node lost, killed,
    out of memory, or its process died (Ray does not say whether it crashed or was
    killed: ``exitcode`` is unknown)."""
    text = str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # Ray's own sentence (after the actor's id, pid and address lines), if it has one.
    said = next((line for line in lines if line.startswith("The actor ") and "because" in line), "")
    kind = type(error).__name__
    if "node has died" in text or "node was terminated" in text:
        why = "its node was lost (Ray marked the node dead)"
    elif "ray.kill" in text:
        why = "it was killed with ray.kill()"
    elif "running low on memory" in text:
        why = "Ray's memory monitor killed it: its node ran low on memory"
    elif kind == "ActorUnavailableError":
        why = "Ray could not reach it any more"
    elif kind.startswith("Object"):
        why = "its reply was lost before it reached this process (its node was lost?)"
    else:
        why = (
            "its process died (Ray does not say how: a crash in native code, os._exit(), "
            "or a kill from outside such as the OOM killer; the worker's log on its node "
            "has the signal)"
        )
    detail = said or (lines[0] if lines else kind)
    return f"{why}. Ray: {kind}: {detail}"


def interrupting_error(error: BaseException) -> BaseException | None:
    """The exception a Python signal handler of this process raised while Ray's C code
    blocked (a ``SIGALRM`` timer's, a preemption handler's), or None. Ray 2.60's wait
    lets only ``KeyboardInterrupt`` and ``SystemExit`` through its signal checks; any
    other exception stays pending, and Python reports the call as a ``SystemError``
    caused by it. It is the user's exception, not a failure of the cluster."""
    cause = error.__cause__
    pending = "returned a result with an exception set" in str(error)
    return cause if type(error) is SystemError and pending and cause is not None else None


def is_startup_failure(error: BaseException) -> bool:
    """The actor could not be created at all (its runtime environment, its placement):
    a replacement would fail alike, so it is a start-up error, not a death."""
    kinds = {"RuntimeEnvSetupError", "ActorUnschedulableError", "ActorPlacementGroupRemoved"}
    if any(cls.__name__ in kinds for cls in type(error).__mro__):
        return True
    return bool(getattr(error, "actor_init_failed", False))


class TraceBoard:
    """A small side channel that survives a worker and its node: the cluster's key-value
    store (on the head node). A traced task (a retry after a death) writes the position
    of the sample it is about to fetch there, so that if its worker dies again, even
    with its node, the driver still learns which sample it was at. Untraced tasks write
    nothing (the driver infers which task ran from the order it sent them)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def key(self, worker_id: int) -> bytes:
        return f"{self.prefix}/{worker_id}".encode()

    @staticmethod
    def write(key: bytes, epoch: int, seq: int, position: int) -> None:
        """In the worker: best effort (a trace that cannot be written names no sample)."""
        value = f"{epoch} {seq} {position}".encode()
        with contextlib.suppress(Exception):
            _gcs().internal_kv_put(key, value, True, _NAMESPACE, timeout=TRACE_TIMEOUT_S)

    def started_key(self, worker_id: int, incarnation: int) -> bytes:
        """Where one incarnation of a worker says it has started (see mark_started)."""
        return f"{self.prefix}/{worker_id}/started/{incarnation}".encode()

    @staticmethod
    def mark_started(key: bytes, pid: int) -> None:
        """In the worker, as its start succeeds, before it replies: a reply can be lost
        with its process (Ray sends it after the method returns; a crash in the next
        task can come first), and the driver would take a death in the first task for a
        death in start-up, and not count it against that task's samples."""
        with contextlib.suppress(Exception):
            value = str(pid).encode()
            _gcs().internal_kv_put(key, value, True, _NAMESPACE, timeout=TRACE_TIMEOUT_S)

    @staticmethod
    def started(key: bytes) -> int | None:
        """In the driver: the pid an incarnation marked as started, or None."""
        try:
            return int(_gcs().internal_kv_get(key, _NAMESPACE, timeout=TRACE_TIMEOUT_S))
        except Exception:
            return None

    def read(self, worker_id: int) -> tuple[int, int, int] | None:
        """In the driver: (epoch, seq, position) last written by that worker, if any."""
        try:
            key = self.key(worker_id)
            value = _gcs().internal_kv_get(key, _NAMESPACE, timeout=TRACE_TIMEOUT_S)
            epoch, seq, position = (int(part) for part in value.split())
        except Exception:
            return None
        return epoch, seq, position

    def clear(self) -> None:
        with contextlib.suppress(Exception):  # gone with the cluster, or never written
            _gcs().internal_kv_del(self.prefix.encode(), True, _NAMESPACE, timeout=KV_TIMEOUT_S)
