"""The shared-memory transport, in one process: encode → decode → release."""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import pytest
from tests.helpers import interrupts

from conveyor._transport.arena import (
    _LOOK_AGAIN_MIN,
    _RECENT,
    PAGE,
    MainArena,
    SlotInfo,
    WorkerArena,
    create_arena_fd,
    round_up,
)
from conveyor._transport.budget import MAX_RUN_AHEAD, RUN_AHEAD_BYTES, run_ahead
from conveyor._transport.codec import Encoder, InlinePayload, SlotPayload
from conveyor._transport.decoder import Decoder
from conveyor._transport.lease import SlotLease
from conveyor.collate import numpy_collate


@pytest.fixture
def pair():
    fd = create_arena_fd(0)
    released: list[int] = []
    worker = WorkerArena(fd, max_slots=3)
    main = MainArena(fd)
    yield Encoder(worker), Decoder(main, released.append), released
    main.close()


def _roundtrip(encoder, decoder, batch):
    with encoder.collating():
        pass
    return decoder.decode(encoder.encode(batch))


def test_arrays_come_back_equal_and_writable(pair):
    encoder, decoder, _ = pair
    batch = {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "y": [1, "a", None]}
    out = _roundtrip(encoder, decoder, batch)
    np.testing.assert_array_equal(out["x"], batch["x"])
    assert out["y"] == [1, "a", None]
    assert out["x"].flags.writeable


def test_slot_is_released_only_when_last_view_dies(pair):
    encoder, decoder, released = pair
    out = _roundtrip(encoder, decoder, {"a": np.ones(100), "b": np.zeros(10)})
    kept = out["a"][10:20]
    del out
    decoder.collect()
    assert released == [] and decoder.batches_alive == 1
    del kept
    assert decoder.batches_alive == 0
    assert released == []  # noted by the weak reference's callback, given back when collected
    decoder.collect()
    assert released == [0]


def test_batch_without_arrays_uses_no_slot(pair):
    encoder, _, _ = pair
    payload = encoder.encode({"n": 3, "s": "text"})
    assert isinstance(payload, InlinePayload)
    assert not payload.slots_exhausted


def test_collate_writes_straight_into_the_leased_slot(pair):
    encoder, decoder, _ = pair
    samples = [np.full((4, 4), i, dtype=np.int64) for i in range(8)]
    first = encoder.encode(numpy_collate(samples))  # sizes the lease for the next batch
    assert isinstance(first, SlotPayload)
    with encoder.collating():
        batch = numpy_collate(samples)
    lease_view = encoder._lease.view
    assert np.shares_memory(batch, lease_view)  # stacked in place, nothing to copy
    payload = encoder.encode(batch)
    assert isinstance(payload, SlotPayload)
    np.testing.assert_array_equal(decoder.decode(payload), np.stack(samples))


def test_falls_back_to_the_pipe_when_every_slot_is_held(pair):
    encoder, decoder, _ = pair
    held = []
    slots = 3  # max_slots, and no run-ahead budget
    for i in range(slots + 2):
        with encoder.collating():
            batch = np.full(1000, i)
        payload = encoder.encode(batch)
        held.append(decoder.decode(payload))
        assert isinstance(payload, SlotPayload) == (i < slots)
    assert isinstance(payload, InlinePayload) and payload.slots_exhausted
    assert [int(b[0]) for b in held] == list(range(slots + 2))


def test_a_batch_that_never_reaches_encode_gives_its_slot_back(pair):
    """Its fetch or collate failed after collate leased a slot: the next lease gives it
    back (before, the main process held it for good, and after max_slots such batches
    every batch went through the pipe)."""
    encoder, decoder, _ = pair
    encoder.encode(np.zeros(1000))  # sizes the next leases
    for i in range(6):  # twice max_slots: a collate that fails every time
        with encoder.collating():
            numpy_collate([np.full(1000, i)] * 2)  # written into the slot, never sent
    with encoder.collating():
        batch = numpy_collate([np.full(1000, 7)] * 2)
    payload = encoder.encode(batch)
    assert isinstance(payload, SlotPayload)
    np.testing.assert_array_equal(decoder.decode(payload), np.full((2, 1000), 7))
    assert len(encoder.arena._slots) <= 3


def test_slots_beyond_max_slots_stay_within_the_run_ahead_budget() -> None:
    # A worker's slots: max_slots of any size, plus as many as fit its share of the
    # run-ahead budget. Memory stays under max_slots x the largest batch + the budget.
    budget = 1 << 20
    small = WorkerArena(create_arena_fd(0), max_slots=2, run_ahead_bytes=budget)
    held = [small.acquire(1000) for _ in range(18)]  # 64 KiB slots: 16 in 1 MiB, then 2
    assert all(lease is not None for lease in held)
    assert small.acquire(1000) is None
    assert small.reserved_bytes() == budget + 2 * (1 << 16)
    big = WorkerArena(create_arena_fd(0), max_slots=2, run_ahead_bytes=budget)
    leases = [big.acquire(600_000) for _ in range(3)]  # 750 KiB slots: 1 in 1 MiB, then 2
    assert all(lease is not None for lease in leases)
    assert big.acquire(600_000) is None
    assert run_ahead(1 << 16, 6, budget) == 16 - 6
    assert run_ahead(750 << 10, 2, budget) == 0
    assert run_ahead(1 << 16, 6, RUN_AHEAD_BYTES) == min(MAX_RUN_AHEAD, 256 - 6)


def test_released_slots_are_reused(pair):
    encoder, decoder, released = pair
    for i in range(20):
        out = _roundtrip(encoder, decoder, np.full(1000, i))
        assert int(out[0]) == i
        del out
        decoder.collect()
        encoder.arena.release(tuple(released))
        released.clear()
    assert len(encoder.arena._slots) <= 2


def test_torch_tensors_of_every_dtype_roundtrip(pair):
    torch = pytest.importorskip("torch")
    encoder, decoder, _ = pair
    tensors = {
        str(dtype): torch.arange(6).reshape(2, 3).to(dtype)
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                      torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool)
    }  # fmt: skip
    tensors["non_contiguous"] = torch.arange(12.0).reshape(3, 4).t()
    tensors["zero_dim"] = torch.tensor(7)
    out = _roundtrip(encoder, decoder, tensors)
    for name, tensor in tensors.items():
        assert out[name].dtype == tensor.dtype, name
        assert torch.equal(out[name], tensor), name


def test_closing_an_arena_keeps_slots_mapped_before_and_refuses_new_ones():
    """A dead worker's arena is closed while its finished batches wait to be taken."""
    fd = create_arena_fd(0)
    encoder = Encoder(WorkerArena(fd, max_slots=4))
    main = MainArena(fd)
    first = encoder.encode(np.full(1000, 7))
    second = encoder.encode(np.full(1000, 9))
    main.map_all([first.slot])
    main.close()
    decoder = Decoder(main, lambda slot: None)
    assert int(decoder.decode(first)[0]) == 7
    with pytest.raises(RuntimeError, match="not mapped"):
        decoder.decode(second)  # never silently zeros


def test_even_the_first_batch_is_stacked_straight_into_a_slot(pair):
    # No size is known before the first batch: the slot is taken on collate's first
    # request, so a big first batch is not built on the heap and copied (twice the
    # memory at its peak).
    encoder, decoder, _ = pair
    samples = [np.full((64, 64), i, dtype=np.float32) for i in range(8)]
    with encoder.collating():
        batch = numpy_collate(samples)
    assert encoder._lease is not None
    assert np.shares_memory(batch, encoder._lease.view)
    payload = encoder.encode(batch)
    assert isinstance(payload, SlotPayload)
    np.testing.assert_array_equal(decoder.decode(payload), np.stack(samples))


def _slot_maps() -> int:
    with open("/proc/self/maps") as maps:
        return sum("/memfd:conveyor-worker-77" in line for line in maps)


@pytest.mark.parametrize("keep_maps", [True, False])
def test_slots_stay_mapped_only_while_in_use_when_maps_are_not_kept(keep_maps: bool) -> None:
    # keep_maps=False is what an address-space limit (ulimit -v) selects.
    fd = create_arena_fd(77)
    encoder = Encoder(WorkerArena(fd, max_slots=4))
    main = MainArena(fd, keep_maps=keep_maps)
    decoder = Decoder(main, lambda slot: None)
    payload = encoder.encode(np.full(1 << 16, 5))
    worker_maps = _slot_maps()  # the worker side's slot, the status pages
    batch = decoder.decode(payload)
    assert _slot_maps() == worker_maps + 1
    del batch
    decoder.collect()  # (as the pool does before it sends the slots given back)
    assert _slot_maps() == worker_maps + (1 if keep_maps else 0)
    again = decoder.decode(encoder.encode(np.full(1 << 16, 6)))  # the same slot, mapped anew
    assert int(again[-1]) == 6
    main.close()


def _lease_and_release(arena: WorkerArena, nbytes: int) -> SlotInfo | None:
    """Take a slot as the encoder does, then let both sides go of it."""
    acquired = arena.acquire(nbytes)
    if acquired is None:
        return None
    slot, base = acquired
    del base  # the worker's arrays are gone
    arena.release((slot.slot_id,))  # and the main process's batch
    return slot


def test_batches_that_outgrow_every_free_slot_still_get_one() -> None:
    # Length bucketing / a curriculum: each batch larger than the last. The free slots
    # are too small; the largest makes room, so no batch falls back to the pipe.
    arena = WorkerArena(create_arena_fd(0), max_slots=3)
    for k in range(1, 13):
        assert _lease_and_release(arena, k * (1 << 16)) is not None, f"batch {k}"
        assert len(arena._slots) <= 3
    assert arena.take_retired(), "outgrown slots were given up"
    assert arena.reserved_bytes() <= 3 * (12 << 16) * 5 // 4 + 3 * 4096


def test_an_outliers_slot_is_given_back_once_batches_are_small_again() -> None:
    arena = WorkerArena(create_arena_fd(0), max_slots=4)
    _lease_and_release(arena, 1 << 26)  # one 64 MiB outlier
    assert arena.reserved_bytes() >= 1 << 26
    for _ in range(40):
        _lease_and_release(arena, 1 << 16)
    assert arena.reserved_bytes() < 1 << 20
    assert len(arena.take_retired()) == 1


@pytest.mark.parametrize("before", [0, 5, 15, 16, 17, 30])
def test_an_outliers_slot_is_given_back_as_it_leaves_the_recent_batches(before: int) -> None:
    """Whatever the phase of the arena's periodic look (``before`` small batches first),
    the outlier's slot goes back within a few batches of the outlier leaving the
    recent ones, not a whole look later: an epoch's last 26 batches were once too few
    (CI: 200 MiB still held as the epoch ended, until the worker idled)."""
    arena = WorkerArena(create_arena_fd(0), max_slots=4)
    for _ in range(before):
        _lease_and_release(arena, 1 << 16)
    _lease_and_release(arena, 1 << 26)
    for _ in range(_RECENT + _LOOK_AGAIN_MIN):
        _lease_and_release(arena, 1 << 16)
    assert len(arena.take_retired()) == 1
    assert arena.reserved_bytes() < 1 << 20


def test_a_mixed_workload_keeps_its_large_slot() -> None:
    # Every tenth batch is large: its slot is needed, so it is not given back.
    arena = WorkerArena(create_arena_fd(0), max_slots=4)
    for k in range(60):
        _lease_and_release(arena, 1 << 24 if k % 10 == 0 else 1 << 16)
    assert arena.take_retired() == ()


def test_the_main_process_drops_its_maps_of_retired_slots() -> None:
    fd = create_arena_fd(0)
    released: list[int] = []
    encoder = Encoder(WorkerArena(fd, max_slots=1))
    main = MainArena(fd, keep_maps=True)
    decoder = Decoder(main, released.append)
    small = decoder.decode(encoder.encode(np.zeros(1 << 14)))
    del small
    decoder.collect()
    encoder.arena.release(tuple(released))
    payload = encoder.encode(np.ones(1 << 20))  # outgrows the one free slot
    assert isinstance(payload, SlotPayload) and payload.retired == (released[0],)
    big = decoder.decode(payload)
    assert float(big[-1]) == 1.0
    assert set(main.maps) == {payload.slot.slot_id}
    main.close()


def _collated(encoder, samples):
    with encoder.collating():
        return numpy_collate(samples)


@pytest.mark.parametrize("as_tensors", [False, True])
@pytest.mark.parametrize(
    "make",
    [
        lambda i: [(np.full(4, i, np.float32), i) for _ in range(8)],  # tuples: a list
        lambda i: [{"x": np.full((2, 3), i, np.int16), "y": float(i)} for _ in range(5)],
        lambda i: [np.full(3, i, np.uint8) for _ in range(6)],  # one array: not a container
    ],
    ids=["list", "dict", "array"],
)
def test_batches_shaped_alike_reuse_the_pickle_and_decode_the_same(
    pair, monkeypatch, make, as_tensors
):
    if as_tensors:
        pytest.importorskip("torch")
    encoder, decoder, released = pair
    encoder.arrays_as_tensors = as_tensors
    for i in range(4):
        out = decoder.decode(encoder.encode(_collated(encoder, make(i))))
        if i == 0:
            known = bool(encoder._metas)
            assert known == isinstance(out, (list, dict))  # containers of arrays only
            if known:  # from now on nothing may be pickled: the first pickle is reused
                from conveyor._transport import codec

                monkeypatch.setattr(codec, "dumps", _never_pickled)
        want = _leaves(numpy_collate(make(i)))
        got = _leaves(out)
        assert len(got) == len(want)
        for value, ref in zip(got, want, strict=True):
            if as_tensors:
                assert type(value).__name__ == "Tensor"
            value = np.asarray(value)
            assert (value.dtype, value.shape) == (ref.dtype, ref.shape)
            np.testing.assert_array_equal(value, ref)
        del out, got, value  # the slot is used again (max_slots=3)
        decoder.collect()
        encoder.arena.release(tuple(released))
        released.clear()


@pytest.mark.parametrize("as_tensors", [False, True])
@pytest.mark.parametrize("container", [list, tuple, dict])
def test_plain_batches_are_rebuilt_without_unpickling_and_stay_views(
    pair, monkeypatch, container, as_tensors
):
    if as_tensors:
        pytest.importorskip("torch")
    from conveyor._transport.decoder import _Plan

    built = []
    build = _Plan.build
    monkeypatch.setattr(_Plan, "build", lambda plan, *a: built.append(1) or build(plan, *a))
    encoder, decoder, released = pair
    encoder.arrays_as_tensors = as_tensors
    for i in range(4):
        arrays = [np.full((3, 2), i, np.float32), np.arange(i, i + 5), np.zeros(0, np.uint8)]
        batch = dict(zip("abc", arrays, strict=True)) if container is dict else container(arrays)
        payload = encoder.encode(batch)
        assert payload.plain
        out = decoder.decode(payload)
        assert len(built) == i  # the first is unpickled; the rest built from its plan
        assert type(out) is container
        got = _leaves(out) if container is not tuple else list(out)
        for value, want in zip(got, arrays, strict=True):
            assert type(value).__name__ == ("Tensor" if as_tensors else "ndarray")
            value = np.asarray(value)
            assert (value.dtype, value.shape) == (want.dtype, want.shape)
            np.testing.assert_array_equal(value, want)
            assert value.flags.writeable
        view = decoder.arena.view(payload.slot)
        assert np.shares_memory(np.asarray(got[0]), view)  # no copy
        kept = got[1]
        del out, got, value
        decoder.collect()
        assert released == []  # a view of the batch is still alive
        del kept
        decoder.collect()
        assert released == [payload.slot.slot_id]
        encoder.arena.release(tuple(released))
        released.clear()


def test_batches_that_are_not_plain_are_always_unpickled(pair):
    encoder, decoder, _ = pair
    for _ in range(2):
        payload = encoder.encode({"x": np.ones(4), "note": "text"})  # a str leaf
        assert not payload.plain
        out = decoder.decode(payload)
        assert out["note"] == "text"
    assert not decoder._plans


def _leaves(batch):
    if isinstance(batch, dict):
        return list(batch.values())
    return list(batch) if isinstance(batch, list) else [batch]


def _never_pickled(*args, **kwargs):
    raise AssertionError("a batch shaped like the last one was pickled again")


def test_a_new_shape_is_pickled_anew(pair):
    encoder, decoder, _ = pair
    for n in (3, 5, 3):
        samples = [(np.full(n, k), k) for k in range(n)]
        batch = decoder.decode(encoder.encode(_collated(encoder, samples)))
        assert batch[0].shape == (n, n) and batch[1].tolist() == list(range(n))
    assert len(encoder._metas) == 2  # one per structure seen


def test_an_outlier_gets_a_slot_while_small_batches_run_ahead() -> None:
    # Run far ahead, every small slot may be in flight: an outlier still gets one of
    # the max_slots large ones (it once fell back to the pipe with a false warning).
    arena = WorkerArena(create_arena_fd(0), max_slots=2, run_ahead_bytes=1 << 20)
    small = [arena.acquire(1000) for _ in range(16)]
    assert all(lease is not None for lease in small)
    outlier = arena.acquire(8 << 20)
    assert outlier is not None
    slot = outlier[0]
    del outlier  # the worker's view of it goes
    arena.release(tuple(lease[0].slot_id for lease in small if lease is not None))
    del small
    for _ in range(20):  # batches are small again
        lease = arena.acquire(1000)
        assert lease is not None
        arena.release((lease[0].slot_id,))
        del lease
    arena.release((slot.slot_id,))  # its release comes last, with nothing left to do
    assert arena.reserved_bytes() > 8 << 20
    arena.trim()
    assert arena.reserved_bytes() < 2 << 20
    assert slot.slot_id in arena.take_retired()


def test_the_next_slot_is_not_sized_like_an_outlier(pair):
    encoder, decoder, released = pair
    for n in (100, 100_000, 100, 100):
        with encoder.collating():
            batch = numpy_collate([np.zeros(n)] * 4)
        out = decoder.decode(encoder.encode(batch))
        assert out.shape == (4, n)
        del out
        decoder.collect()
        encoder.arena.release(tuple(released))
        released.clear()
    sizes = sorted(slot.size for slot in encoder.arena._slots.values())
    assert sum(size > 1 << 20 for size in sizes) == 1  # the outlier's alone


def test_the_heap_keeper_keeps_twice_the_largest_batch_of_freed_heap():
    from conveyor._workers.heap import MAX_TRIM, MIN_TRIM, MMAP_THRESHOLD, HeapKeeper

    calls: list[tuple[int, int]] = []
    keeper = HeapKeeper(mallopt=lambda option, value: calls.append((option, value)) or 1)
    assert calls == [(-3, MMAP_THRESHOLD), (-1, MIN_TRIM)]
    keeper.batch_made(10 << 20)  # within the first threshold: nothing to change
    assert len(calls) == 2
    keeper.batch_made(40 << 20)
    assert calls[-1] == (-1, 128 << 20) and keeper.trim == 128 << 20
    keeper.batch_made(3 << 30)
    assert calls[-1] == (-1, MAX_TRIM)


def test_the_heap_keeper_does_nothing_where_mallopt_fails():
    from conveyor._workers.heap import HeapKeeper

    calls: list[tuple[int, int]] = []
    keeper = HeapKeeper(mallopt=lambda option, value: calls.append((option, value)) or 0)
    keeper.batch_made(1 << 30)
    assert calls == [(-3, 32 << 20)] and keeper.trim == 0


def test_a_slots_pages_are_reserved_as_batches_reach_them() -> None:
    """A slot keeps a quarter more than its first batch for larger ones: that headroom
    costs address space, not memory, until a batch writes there."""
    fd = create_arena_fd(0)
    arena = WorkerArena(fd, max_slots=2)
    arena.status_page[0] = 0  # in use in a worker: its page is there

    def reserved() -> int:
        return os.fstat(fd).st_blocks * 512 - PAGE  # less the status page

    acquired = arena.acquire(600_000)
    assert acquired is not None
    slot, view = acquired
    assert slot.size == round_up(750_000)
    assert reserved() == round_up(600_000)
    lease = SlotLease(slot, view, arena=arena, reserved=600_000)
    assert lease.allocate(600_000) is not None
    assert lease.allocate(100_000) is not None  # into the headroom: reserved now
    assert reserved() == round_up(700_000 + 64)  # (the second array starts aligned)
    del lease, view, acquired
    arena.release((slot.slot_id,))
    again = arena.acquire(740_000)  # the same slot, for a larger batch
    assert again is not None and again[0].slot_id == slot.slot_id
    assert reserved() == round_up(740_000)


def test_a_ctrl_c_as_a_batch_dies_is_raised_in_the_users_code_and_its_slot_still_goes_back(
    pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch dies in whatever code drops it, and its weak reference's callback runs
    # there. Were that callback Python, a Ctrl-C arriving then would be raised inside it,
    # where Python prints it as ignored: the user's interrupt lost (CI saw it once in the
    # Ctrl-C sweep over spawn start-ups).
    encoder, decoder, released = pair
    ignored: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    ctrl_c = interrupts.CtrlCAsItDies(_roundtrip(encoder, decoder, np.ones(100)))
    assert isinstance(ctrl_c.drop(), KeyboardInterrupt)  # the batch dies, a SIGINT just before
    assert ignored == []
    assert released == [] and decoder.batches_alive == 0
    decoder.collect()
    assert released == [0]


def test_a_ctrl_c_as_a_maps_last_array_dies_is_raised_in_the_users_code_and_it_is_unmapped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The last array over a mapped slot may die in the user's code (a batch kept past its
    # slot's retirement, or past its loader). The unmap runs then: written in Python, a
    # Ctrl-C just before would be raised inside it, printed as ignored, and the region
    # never unmapped.
    from conveyor._transport.memfd import map_range

    fd = create_arena_fd(78)
    os.ftruncate(fd, 4 * PAGE)

    def maps() -> int:
        with open("/proc/self/maps") as lines:
            return sum("/memfd:conveyor-worker-78" in line for line in lines)

    ignored: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    region = map_range(fd, 0, 4 * PAGE, "a test")
    os.close(fd)  # the map needs no descriptor
    assert maps() == 1
    ctrl_c = interrupts.CtrlCAsItDies(region[PAGE:])
    del region
    assert isinstance(ctrl_c.drop(), KeyboardInterrupt)  # the last array dies, a SIGINT before
    assert ignored == []
    assert maps() == 0


def test_the_references_that_unmap_regions_are_let_go_once_spent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One weak reference per region mapped, kept until its region is unmapped: a long run
    # that maps anew for each batch (maps not kept), at ever new addresses, must not keep
    # every one it made.
    from conveyor._transport import memfd

    monkeypatch.setattr(memfd, "_unmaps", memfd._Unmaps())  # (other tests' regions aside)
    fd = create_arena_fd(76)
    os.ftruncate(fd, 600 * PAGE)
    addresses = set()
    for pages in range(1, 601):  # a size of its own each: an address of its own
        region = memfd.map_range(fd, 0, pages * PAGE, "a test")
        addresses.add(region.ctypes.data)
        del region  # unmapped
    os.close(fd)
    spent = [ref for ref in memfd._unmaps._refs.values() if ref() is None]
    assert len(addresses) > 2 * memfd._Unmaps._PRUNE_FROM  # (else this shows nothing)
    assert len(spent) < memfd._Unmaps._PRUNE_FROM
