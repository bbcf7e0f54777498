"""Ray workers (``worker_method="ray"``) on a cluster of two nodes: the same loader as
with process workers — torch's batches in torch's order, errors of their own type
naming the worker, ``on_error="skip"``, ``worker_init_fn`` and ``get_worker_info()`` in
each actor, ``reseed``, persistent workers, and states that move between Ray and
process workers both ways. Faults are in test_ray_faults.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

from conveyor import DataLoader, get_worker_info  # noqa: E402
from tests.helpers.ray_cluster import LocalCluster, worker_processes  # noqa: E402
from tests.parity.test_torch_parity import Case, check_parity, ray_cases  # noqa: E402
from tests.resume.datasets import plain  # noqa: E402

from . import datasets as ds  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.filterwarnings("ignore:This DataLoader")]

ROOT = Path(__file__).resolve().parents[2]
HEAD_CPUS = 1
NODES = [{"num_cpus": 2}]  # a second node: the driver's node and another

SPREAD = {"num_cpus": 0.5}  # small workers: several fit each node of the test cluster
# Process workers beside Ray's: this process runs Ray's threads, which the pre-flight
# rightly warns fork about; they hold no lock the workers need here.
_FORK = {"multiprocessing_context": "fork", "preflight": False}


def _loader(dataset: Any, **kwargs: Any) -> DataLoader:
    kwargs.setdefault("batch_size", 3)
    kwargs.setdefault("num_workers", 3)
    kwargs.setdefault("worker_options", SPREAD)
    return DataLoader(dataset, worker_method="ray", **kwargs)


def test_each_worker_is_an_actor_with_its_own_worker_info(cluster: LocalCluster) -> None:
    started: dict[int, tuple[int, str]] = {}

    def init(worker_id: int) -> None:
        info = get_worker_info()
        assert info is not None and info.id == worker_id and info.worker_method == "ray"
        assert info.num_workers == 3
        info.dataset.tag = 10 * worker_id + 1  # its own copy of the dataset

    dataset = ds.Where()
    batches = list(_loader(dataset, worker_init_fn=init))
    for batch in batches:
        columns = (batch["worker"].tolist(), batch["pid"].tolist(), batch["node"])
        for worker, pid, node in zip(*columns, strict=True):
            assert started.setdefault(worker, (pid, node)) == (pid, node)
        assert batch["tag"].tolist() == [10 * w + 1 for w in batch["worker"].tolist()]
    assert [i for b in batches for i in b["i"].tolist()] == list(range(24))
    assert sorted(started) == [0, 1, 2]
    assert os.getpid() not in {pid for pid, _ in started.values()}
    assert dataset.tag == -1 and get_worker_info() is None  # nothing ran here


def test_workers_spread_over_the_nodes_they_fit_on(cluster: LocalCluster) -> None:
    """One CPU per worker by default: three workers cannot all fit one node of two."""
    nodes = {node for batch in _loader(ds.Where(), worker_options=None) for node in batch["node"]}
    assert len(nodes) == 2


def test_batches_are_writable_tensors_read_in_place_from_the_object_store(
    cluster: LocalCluster,
) -> None:
    """An image batch made on this node is a view of Ray's shared memory here, and as
    writable as torch's own (no copy, no warning)."""
    here = ray.get_runtime_context().get_node_id()
    options = {"num_cpus": 0.5, "scheduling_strategy": _on_node(here)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on tensors over read-only memory
        # 16 images of 12 KiB: over Ray's 100 KiB limit for replies sent inline.
        loader = _loader(ds.Images(), batch_size=16, num_workers=2, worker_options=options)
        for images, labels in loader:
            assert images.dtype == torch.uint8 and images.shape == (16, 3, 64, 64)
            assert images[:, 0, 0, 0].tolist() == labels.tolist()
            assert "/dev/shm/plasma" in _mapping_of(images.data_ptr())
            images += 1  # writable, as the user's own batch


def _on_node(node_id: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def _mapping_of(address: int) -> str:
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, *rest = line.split()
            low, high = (int(x, 16) for x in span.split("-"))
            if low <= address < high:
                return " ".join(rest)
    return ""


def test_the_dataset_is_pickled_once_whatever_the_number_of_workers(
    cluster: LocalCluster,
) -> None:
    ds.CountsPickles.pickled = 0
    dataset = ds.CountsPickles()
    assert [b.tolist() for b in _loader(dataset, batch_size=4, num_workers=3)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
    ]
    assert ds.CountsPickles.pickled == 1


def test_an_error_keeps_its_type_and_names_the_worker(cluster: LocalCluster) -> None:
    with pytest.raises(ValueError, match="sample 7 is corrupt") as caught:
        list(_loader(ds.Where(bad=(7,))))
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "DataLoader worker" in notes and "fetch" in notes and "[6, 7, 8]" in notes


def test_on_error_skip_leaves_the_bad_samples_out_within_the_budget(
    cluster: LocalCluster,
) -> None:
    loader = _loader(ds.Where(bad=(4, 17)), on_error="skip", max_errors=2)
    got = [i for batch in loader for i in batch["i"].tolist()]
    assert got == [i for i in range(24) if i not in (4, 17)]
    assert [s.index for s in loader.skipped_samples] == [4, 17]
    with pytest.raises(ValueError, match="sample 9 is corrupt"):
        list(_loader(ds.Where(bad=(4, 9)), on_error="skip", max_errors=1))


def test_an_iterable_dataset_shards_through_get_worker_info(cluster: LocalCluster) -> None:
    got = [i for batch in _loader(ds.Shards()) for i in batch.tolist()]
    assert sorted(got) == list(range(30))


def test_persistent_workers_keep_their_actors_across_epochs(cluster: LocalCluster) -> None:
    loader = _loader(ds.Where(12), persistent_workers=True)
    pids = []
    for _ in range(3):
        batches = list(loader)
        assert [i for b in batches for i in b["i"].tolist()] == list(range(12))
        pids.append({tuple(b["pid"].tolist()) for b in batches})
    assert pids[0] == pids[1] == pids[2]
    assert len(worker_processes(cluster)) == 3
    del loader, batches


@pytest.mark.parametrize("persistent", [False, True], ids=["per-epoch", "persistent"])
def test_an_iterated_loader_pickles_and_copies_its_iterator_refuses_as_torchs(
    cluster: LocalCluster, persistent: bool
) -> None:
    """As with process and thread workers (tests/unit/test_framework_view.py): the copy
    starts afresh on actors of its own; the iterator refuses with NotImplementedError."""
    import copy
    import pickle

    loader = _loader(ds.Where(12), persistent_workers=persistent)
    iterator = iter(loader)
    next(iterator)
    for attempt in (pickle.dumps, copy.deepcopy):
        with pytest.raises(NotImplementedError, match="cannot be pickled"):
            attempt(iterator)
    copied = pickle.loads(pickle.dumps(loader))
    assert copied.worker_method == "ray" and copied.worker_options == SPREAD
    assert [i for b in copied for i in b["i"].tolist()] == list(range(12))
    assert sum(len(b["i"]) for b in iterator) == 12 - 3  # the original goes on
    del loader, iterator, copied


@pytest.mark.parametrize("reseed", ["worker", "batch"])
def test_augmentations_are_the_same_as_with_process_workers(
    cluster: LocalCluster, reseed: str
) -> None:
    """The same draws from the process's generators and the worker's own, worker by
    worker as torch seeds them, or batch by batch with reseed="batch"."""

    def draws(**kwargs: Any) -> list[Any]:
        seed = torch.Generator().manual_seed(5)  # the base seed, drawn as torch draws it
        loader = DataLoader(
            ds.Draws(), batch_size=4, num_workers=2, reseed=reseed, generator=seed, **kwargs
        )
        return [plain(b) for b in loader]

    processes = draws(multiprocessing_context="fork", preflight=False)  # see _FORK
    assert draws(worker_method="ray", worker_options=SPREAD) == processes


# --- resume across worker methods -------------------------------------------------------


def _draws_loader(num_workers: int, method: str, seed: int = 3) -> DataLoader:
    extra: dict[str, Any] = {"worker_method": method}
    if method == "ray":
        extra["worker_options"] = SPREAD
    else:
        extra.update(_FORK)
    return DataLoader(
        ds.Draws(),
        batch_size=4,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        num_workers=num_workers,
        reseed="batch",
        **extra,
    )


def _take(loader: DataLoader, it: Any, count: int) -> tuple[list[Any], dict[str, Any]]:
    batches = [plain(next(it)) for _ in range(count)]
    return batches, json.loads(json.dumps(loader.state_dict()))


def test_a_state_moves_from_ray_to_processes_and_back_exactly(cluster: LocalCluster) -> None:
    """Four Ray workers, then two processes, then three Ray workers: the batches and
    the random draws of an uninterrupted run with two processes."""
    expected = [plain(b) for b in _draws_loader(2, "multiprocessing")]
    first = _draws_loader(4, "ray")
    got, state = _take(first, iter(first), 3)
    del first
    middle = _draws_loader(2, "multiprocessing", seed=99)
    middle.load_state_dict(state)
    more, state = _take(middle, iter(middle), 4)
    del middle
    last = _draws_loader(3, "ray", seed=7)
    last.load_state_dict(state)
    assert got + more + [plain(b) for b in last] == expected


# --- the conformance table ---------------------------------------------------------------


@pytest.mark.parametrize("case", ray_cases())
def test_ray_workers_give_torchs_batches(cluster: LocalCluster, case: Case) -> None:
    check_parity(case)


# --- the docs -----------------------------------------------------------------------------


def test_the_lightning_example_of_the_docs_trains(cluster: LocalCluster, tmp_path: Path) -> None:
    """docs/ray.md's Lightning example, as written, in a process of its own, run with
    RAY_ADDRESS as the page says. (Without it, Ray 2.60's ``ray.init()`` finds this
    cluster but, with several raylets on one machine, its actors die at once: "all
    references to the actor were removed". One raylet a machine, as in real clusters,
    does not do that.)"""
    pytest.importorskip("lightning", reason="CI installs lightning (.ci/run)")
    page = (ROOT / "docs" / "ray.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "lightning" in b]
    script = tmp_path / "train.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": cluster.cluster.address}
    result = subprocess.run(
        [sys.executable, "-W", "ignore", str(script)],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "`Trainer.fit` stopped: `max_epochs=2` reached." in output
