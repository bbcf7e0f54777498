"""Shared memory: a tiny /dev/shm does not matter, exhaustion is a clear error."""

from __future__ import annotations

import collections
import contextlib
import errno
import gc
import os
import shutil
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

import conveyor
from conveyor import SharedMemoryExhaustedError
from conveyor._transport import arena as arena_module
from conveyor._transport.arena import WorkerArena, create_arena_fd
from tests.helpers.leaks import no_leaks

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from conveyor import DataLoader

    class Images:
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return np.full((3, 224, 224), i % 251, dtype=np.uint8)

    if __name__ == "__main__":
        loader = DataLoader(Images(), batch_size=16, num_workers=2,
                            multiprocessing_context=sys.argv[1])
        sums = [int(b[:, 0, 0, 0].sum()) for b in loader]
        assert sums == [sum(range(i, i + 16)) for i in range(0, 64, 16)], sums
        print("ok", len(sums))
    """
)


def _can_make_mount_namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "true"], capture_output=True, timeout=30, check=False
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _can_make_mount_namespaces(), reason="needs unshare --mount (root)")
@pytest.mark.slow  # a process in a mount namespace of its own (about 3 s)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_one_megabyte_dev_shm_does_not_matter(tmp_path, method):
    """torch needs /dev/shm for every batch (bus errors in small containers);
    conveyor's memfds are not on /dev/shm. 4 batches of 2.4 MB through a 1 MB one."""
    script = tmp_path / "images.py"
    script.write_text(SCRIPT)
    command = f"mount -t tmpfs -o size=1m tmpfs /dev/shm && {sys.executable} {script} {method}"
    result = subprocess.run(
        ["unshare", "--mount", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok 4"


def test_exhausted_memory_is_an_error_naming_the_size(monkeypatch):
    """When the kernel cannot reserve a slot's pages, say how much and what to do."""

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(arena_module.os, "posix_fallocate", no_space)
    arena = WorkerArena(create_arena_fd(0), max_slots=2)
    with pytest.raises(SharedMemoryExhaustedError) as caught:
        arena.acquire(9_633_792)  # one 64-image batch
    message = str(caught.value)
    assert "9.2 MiB" in message  # the batch it tried to reserve
    assert "lower batch_size, prefetch_factor or num_workers" in message
    assert isinstance(caught.value, MemoryError)


def test_exhausted_memory_keeps_earlier_slots_usable(monkeypatch):
    arena = WorkerArena(create_arena_fd(0), max_slots=4)
    first = arena.acquire(1000)
    assert first is not None
    monkeypatch.setattr(
        arena_module.os,
        "posix_fallocate",
        lambda fd, offset, length: (_ for _ in ()).throw(OSError(errno.ENOMEM, "no memory")),
    )
    with pytest.raises(SharedMemoryExhaustedError):
        arena.acquire(10_000_000)
    _, view = first
    view[:4] = np.arange(4, dtype=np.uint8)  # still mapped and writable
    assert list(view[:4]) == [0, 1, 2, 3]


class Full:
    """Sample ``i`` is 256 copies of ``i``."""

    def __len__(self) -> int:
        return 400

    def __getitem__(self, index: int) -> np.ndarray:
        return np.full(256, index, dtype=np.int64)


class BankingCollate:
    """Keeps the last 16 batches it made (a memory bank, mixing with older batches)
    and checks on every call that none of them changed since."""

    def __init__(self) -> None:
        self.bank: collections.deque[tuple[Any, np.ndarray]] = collections.deque(maxlen=16)

    def __call__(self, samples: list[np.ndarray]) -> Any:
        batch = conveyor.default_collate(samples)
        for kept, expected in self.bank:
            if not np.array_equal(np.array(kept.tolist()), expected):
                raise AssertionError("a batch the collate_fn kept was overwritten")
        self.bank.append((batch, np.array(batch.tolist())))  # a tensor or an array
        return batch


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_batch_the_worker_still_holds_is_never_overwritten(method: str) -> None:
    loader = conveyor.DataLoader(
        Full(), batch_size=4, num_workers=1, collate_fn=BankingCollate(),
        multiprocessing_context=method, run_ahead=False,
    )  # fmt: skip
    # The worker keeps 16 batches, more than its slots (prefetch_factor + 4 without the
    # run-ahead's budget): it says so (not that this process holds them) and copies
    # through the pipe; nothing is overwritten.
    with pytest.warns(conveyor.BatchesHeldWarning, match="held by arrays the worker itself"):
        seen = [int(batch[0][0]) for batch in loader]  # each batch dropped at once
    assert seen == list(range(0, 400, 4))


def test_mapped_slots_hold_no_file_descriptor() -> None:
    # Each worker's memfd is held once by the main process (plus its status page's
    # map), however many slots are mapped: 96 workers whose batches the loop keeps
    # must not run into `ulimit -n` mid-epoch.
    from tests.helpers import leaks

    gc.collect()  # other tests' loaders: their memfds have the same names
    before = collections.Counter(leaks.memfd_fds().values())
    loader = conveyor.DataLoader(
        Full(),
        batch_size=4,
        num_workers=2,
        prefetch_factor=2,
        multiprocessing_context="fork",
        run_ahead=False,  # no slots beyond prefetch_factor + 4 for the batches kept
    )
    kept = []
    with pytest.warns(conveyor.BatchesHeldWarning):  # keeps more than the slots
        for batch in loader:
            kept.append(batch)
            if len(kept) == 12:
                per_worker = collections.Counter(leaks.memfd_fds().values())
                per_worker.subtract(before)
    assert len(kept) == 100
    assert per_worker and max(per_worker.values()) <= 2, per_worker


def test_small_batches_kept_by_the_loop_stay_in_shared_memory_within_the_budget() -> None:
    # A validation loop that keeps its small batches (list(loader)): more slots, up to
    # the run-ahead budget (16 MiB a loader), rather than the pipe and a warning.
    loader = conveyor.DataLoader(
        Full(), batch_size=4, num_workers=2, prefetch_factor=2, multiprocessing_context="fork"
    )
    kept = list(loader)  # 100 batches of 8 KiB: a 64 KiB slot each, 6.4 MiB in all
    assert [int(b[0][0]) for b in kept] == list(range(0, 400, 4))
    del kept, loader


class _Nested:
    """Samples that are nested tensors (ragged rows), as torch's own suite sends them."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        import warnings

        import torch

        with warnings.catch_warnings():  # "prototype stage": torch's own note, not ours
            warnings.simplefilter("ignore")
            return torch.nested.nested_tensor([torch.arange(i + 1.0), torch.ones(2)])


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
def test_nested_tensors_cross_as_torch_sends_them() -> None:
    torch = pytest.importorskip("torch")
    ours = list(conveyor.DataLoader(_Nested(), batch_size=None, num_workers=2))
    theirs = list(torch.utils.data.DataLoader(_Nested(), batch_size=None, num_workers=2))
    for a, b in zip(ours, theirs, strict=True):
        assert a.is_nested
        assert [t.tolist() for t in a.unbind()] == [t.tolist() for t in b.unbind()]


def _memfd_inodes(pid: int | str) -> tuple[set[int], set[int]]:
    """Inodes of conveyor memfds a process holds: (by descriptor, by map)."""
    held = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{name}").startswith("/memfd:conveyor-"):
                held.add(os.stat(f"/proc/{pid}/fd/{name}").st_ino)
    with open(f"/proc/{pid}/maps") as maps:
        mapped = {int(line.split()[4]) for line in maps if "/memfd:conveyor-" in line}
    return held, mapped


class _Blocks:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(1 << 16, i, dtype=np.uint8)


def test_a_forked_worker_lets_go_of_other_loaders_shared_memory() -> None:
    # A validation loader started mid-epoch forks while the training loader's arenas
    # are open and one of its batches is held: its worker must not keep them alive.
    training = iter(conveyor.DataLoader(_Blocks(), batch_size=2, num_workers=2))
    held = next(training)
    training_fds, training_maps = _memfd_inodes("self")
    assert training_fds and training_maps
    validation = conveyor.DataLoader(
        _Blocks(), batch_size=2, num_workers=1, persistent_workers=True
    )
    validating = iter(validation)
    batch = next(validating)
    [worker] = validating._workers
    fds, maps = _memfd_inodes(worker.pid)
    assert len(fds) == 1 and not fds & training_fds, "other loaders' memfds kept open"
    assert not maps & training_maps, "other loaders' slots still mapped"
    # The validation loader itself works on, and the training batch is intact.
    assert [int(b[0, 0]) for b in [batch, *validating]] == [0, 2, 4, 6]
    assert int(held[1, 0]) == 1 and [int(b[0, 0]) for b in training] == [2, 4, 6]


LIMITED_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    import conveyor
    from conveyor import DataLoader

    class Quarters:  # 4 samples of 16 MiB: 64 MiB batches
        def __len__(self):
            return 40

        def __getitem__(self, i):
            return np.full(1 << 24, i, dtype=np.uint8)

    def address_space():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024

    # ulimit -v: what this process already uses plus some headroom (MiB).
    limit = address_space() + (int(sys.argv[1]) << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    loader = DataLoader(Quarters(), batch_size=4, num_workers=4)
    try:
        firsts = [int(batch[0, 0]) for batch in loader]
    except conveyor.SharedMemoryExhaustedError as exc:
        print("error:", exc)
    else:
        assert firsts == list(range(0, 40, 4)), firsts
        print("delivered", len(firsts))
    """
)


def _under_address_space_limit(tmp_path: Any, headroom_mib: int) -> str:
    script = tmp_path / "limited.py"
    script.write_text(LIMITED_SCRIPT)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(script), str(headroom_mib)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.slow  # a child process under ulimit -v (about 5 s)
def test_under_ulimit_v_only_slots_in_use_are_mapped(tmp_path: Any) -> None:
    # Mapping every slot of 4 workers for the loader's life takes 12 slots of 80 MiB
    # (960 MiB) beyond the process's own address space; the batches in flight, at most
    # 4 workers x prefetch 2 = 8 slots, and the one the loop holds (720 MiB) fit in 800.
    # (600 sufficed only while the loop kept up: on a loaded machine 7 batches were
    # waiting, mapped, and the 8th failed.)
    assert _under_address_space_limit(tmp_path, 800) == "delivered 10"


@pytest.mark.slow
def test_a_limit_too_small_for_a_batch_is_an_error_naming_it(tmp_path: Any) -> None:
    out = _under_address_space_limit(tmp_path, 150)
    assert out.startswith("error: Could not map 80.0 MiB of shared memory"), out
    assert "limited to" in out and "(ulimit -v)" in out and "Fix: raise the limit" in out


class _Growing:
    """Batch k (batch_size=1) holds (k + 1) x 64 KiB: a curriculum, length bucketing."""

    def __len__(self) -> int:
        return 60

    def __getitem__(self, k: int) -> np.ndarray:
        return np.full((k + 1) << 16, k % 251, dtype=np.uint8)


def test_batches_that_keep_growing_still_go_through_shared_memory() -> None:
    # They used to outgrow every slot, fall back to the pipe (54 of 60) and warn that
    # the loop held batches it did not hold. The warning would fail this test.
    loader = conveyor.DataLoader(_Growing(), batch_size=None, num_workers=2)
    sizes = [(batch.shape[0], int(batch[-1])) for batch in loader]
    assert sizes == [((k + 1) << 16, k % 251) for k in range(60)]


@pytest.mark.parametrize("run_ahead", [True, False])
def test_breaking_every_epoch_gives_back_the_slots_of_batches_never_handed_out(
    run_ahead: bool,
) -> None:
    # Persistent workers and an epoch cut short (Lightning's limit_train_batches): the
    # batches that arrived but were never handed out once kept their slots, so a few
    # epochs later every batch went through the pipe with a false "slots held" warning.
    loader = conveyor.DataLoader(
        list(range(64)),
        batch_size=2,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
        run_ahead=run_ahead,
    )
    with no_leaks():
        for _ in range(12):
            batches = iter(loader)
            for _ in range(3):
                next(batches)  # then break off the epoch
        assert [int(b[0]) for b in loader] == list(range(0, 64, 2))  # BatchesHeldWarning: error
        del batches, loader
