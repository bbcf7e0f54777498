"""Spawned workers defer importing torch, and batches are still exactly torch's.

A worker whose dataset does not use torch collates in NumPy where that is
provably torch's result, and the main process makes the tensors while
unpickling; anything else makes the worker import torch and use its rules.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.integration import torchless_datasets as ds

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader as TorchDataLoader  # noqa: E402

import conveyor  # noqa: E402

METHODS = ["spawn", "forkserver"]
ROOT = Path(__file__).resolve().parents[2]


def _equal(a, b, path="batch"):
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, (
            f"{path}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        )
        assert torch.equal(a, b), f"{path}: values differ"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _equal(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _equal(x, y, f"{path}[{i}]")
    elif hasattr(a, "dtype"):  # NumPy leaves torch keeps (string arrays)
        assert a.dtype == b.dtype and (a == b).all(), path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _both(dataset, method, **kwargs):
    torch.manual_seed(7)
    ours = list(conveyor.DataLoader(dataset, multiprocessing_context=method, **kwargs))
    torch.manual_seed(7)
    theirs = list(TorchDataLoader(dataset, **kwargs))  # fork: the reference
    return ours, theirs


@pytest.mark.parametrize("method", METHODS)
def test_workers_do_not_import_torch_for_a_numpy_dataset(method):
    """In a fresh interpreter: the fork server is one per process, and another
    test's preloads (a dataset module importing torch) would leak into it."""
    code = textwrap.dedent(
        f"""
        import torch, conveyor
        from tests.integration import torchless_datasets as ds
        loader = conveyor.DataLoader(
            ds.TorchPresence(), batch_size=2, num_workers=1, multiprocessing_context={method!r}
        )
        batches = list(loader)
        assert isinstance(batches[0]["x"], torch.Tensor), type(batches[0]["x"])
        print([bool(b) for batch in batches for b in batch["torch_loaded"]])
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str([False] * 4)


@pytest.mark.parametrize("method", METHODS)
def test_numpy_collate_in_the_worker_gives_torchs_batches(method):
    ours, theirs = _both(ds.Mixed(), method, batch_size=5, num_workers=2)
    _equal(ours, theirs)


@pytest.mark.parametrize("method", METHODS)
def test_leaves_with_torch_only_rules_make_the_worker_use_torch(method):
    ours, theirs = _both(ds.NeedsTorchRules(), method, batch_size=4, num_workers=1)
    _equal(ours, theirs)
    assert ours[0]["int_or_float"].dtype == torch.float32  # torch's default dtype, not NumPy's


@pytest.mark.parametrize("method", METHODS)
def test_batch_size_none_converts_like_torch(method):
    ours, theirs = _both(ds.Unbatched(), method, batch_size=None, num_workers=1)
    _equal(ours, theirs)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("use_torch", [False, True])
def test_worker_randomness_matches_torch_even_when_torch_comes_late(method, use_torch):
    ours, theirs = _both(ds.Randoms(use_torch), method, batch_size=3, num_workers=2)
    _equal(ours, theirs)


@pytest.mark.parametrize("method", METHODS)
def test_mixed_dtypes_promote_as_torch_does_in_process(method):
    """torch's own workers raise TypeError here (they stack into shared memory
    typed like the first sample); conveyor gives what torch gives in-process."""
    ours = list(
        conveyor.DataLoader(
            ds.MixedArrays(), batch_size=4, num_workers=1, multiprocessing_context=method
        )
    )
    theirs = list(TorchDataLoader(ds.MixedArrays(), batch_size=4))
    _equal(ours, theirs)


@pytest.mark.parametrize("method", METHODS)
def test_a_custom_collate_calling_default_collate_still_gets_tensors(method):
    loader = conveyor.DataLoader(
        ds.Mixed(),
        batch_size=4,
        num_workers=1,
        multiprocessing_context=method,
        collate_fn=ds.collate_via_default,
    )
    reference = TorchDataLoader(ds.Mixed(), batch_size=4)
    _equal([b["wrapped"] for b in loader], list(reference))


@pytest.mark.parametrize("method", METHODS)
def test_a_registration_made_in_the_worker_is_honoured(method):
    """The worker defers torch until the registered function runs: from then on it builds
    torch's batches itself, and the function's NumPy array arrives as NumPy."""
    ours = list(
        conveyor.DataLoader(
            ds.Tagged(),
            batch_size=4,
            num_workers=1,
            multiprocessing_context=method,
            worker_init_fn=ds.register_tags_with_conveyor,
        )
    )
    theirs = list(
        TorchDataLoader(
            ds.Tagged(), batch_size=4, num_workers=1, worker_init_fn=ds.register_tags_with_torch
        )
    )
    _equal(ours, theirs)
    assert [type(b["tag"]) for b in ours] == [np.ndarray] * 3


@pytest.mark.parametrize("method", METHODS)
def test_a_registration_of_conveyors_own_does_not_make_workers_import_torch(method):
    """The maps reach the workers without naming torch (torch's holds only its defaults):
    batches that never meet the registered type stay torch-free."""
    code = textwrap.dedent(
        f"""
        import torch, conveyor
        from conveyor.collate import default_collate_fn_map
        from tests.integration import torchless_datasets as ds
        default_collate_fn_map[ds.Tag] = ds.collate_tags
        loader = conveyor.DataLoader(
            ds.TorchPresence(), batch_size=2, num_workers=1, multiprocessing_context={method!r}
        )
        batches = list(loader)
        assert isinstance(batches[0]["x"], torch.Tensor), type(batches[0]["x"])
        print([bool(b) for batch in batches for b in batch["torch_loaded"]])
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str([False] * 4)
