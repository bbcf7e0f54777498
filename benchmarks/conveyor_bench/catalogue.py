"""The benchmark's workloads, by name (``WORKLOADS``): each one's dataset, settings and targets."""

from __future__ import annotations

from collections.abc import Callable

from conveyor_bench.specs import Variant, WorkloadSpec
from conveyor_bench.workloads import (
    DECODE_IMAGES,
    BigDataset,
    CpuDataset,
    DecodeDataset,
    FloatImageDataset,
    FreshImageDataset,
    ImageDataset,
    MapDataset,
    PathListDataset,
    SleepDataset,
    TextDataset,
    TinyDataset,
    calibrate_spin,
    pad_collate,
    pad_collate_shared,
)

_CPU_ITERATIONS: list[int] = []


def _cpu_dataset(length: int, quick: bool) -> CpuDataset:
    if not _CPU_ITERATIONS:
        _CPU_ITERATIONS.append(calibrate_spin())
    return CpuDataset(length, _CPU_ITERATIONS[0])


def _paths_dataset(length: int, quick: bool) -> PathListDataset:
    return PathListDataset(length // 10 if quick else length)


THREADS = Variant("2 thread workers", 2, (("worker_method", "thread"),))
AUTO = Variant("num_workers='auto'", "auto")


def _decode_dataset(length: int, quick: bool) -> DecodeDataset:
    from conveyor_bench import imaging  # Pillow: an ImportError that says how to get it

    if quick:
        return DecodeDataset(length, imaging.make_jpegs(16, (160, 120)))
    return DecodeDataset(length, imaging.make_jpegs(DECODE_IMAGES))


def _image_folder(torchvision_io: bool) -> Callable[[int, bool], MapDataset]:
    """The torchvision workloads' dataset (torchvision is imported only when it is built)."""

    def make(length: int, quick: bool) -> MapDataset:
        from conveyor_bench import vision  # torchvision: NeedsTorchvision says how to get it

        return vision.image_folder(length, quick, torchvision_io=torchvision_io)

    return make


# The kinds of worker the torchvision rows compare with torch's processes. Their threads
# share torch's global generator (the pre-flight would warn of it): timed as they run.
VISION_VARIANTS = (
    Variant("2 thread workers", 2, (("worker_method", "thread"), ("preflight", False))),
    Variant(
        "2 processes x 2 threads", 2, (("threads_per_worker", 2), ("preflight", False)), cores=4
    ),
)
_VISION = "torchvision's ImageFolder over decode's JPEGs on disk, v2 RandomResizedCrop(224), "
_VISION += "RandomHorizontalFlip, ToImage, ToDtype(float32), Normalize; "

# Issue 40's targets (36's were 1.5 and 1.15) for the loads whose bytes or per-batch costs
# are the loader's own.
CPU_MAIN_OF_REFERENCE, CPU_WORKERS_OF_REFERENCE = 1.25, 1.05

WORKLOADS: dict[str, WorkloadSpec] = {
    spec.name: spec
    for spec in (
        WorkloadSpec(
            name="tiny",
            summary="16-float32 vector + int label per sample; per-batch overhead dominates",
            kind="throughput",
            make_dataset=lambda n, quick: TinyDataset(n),
            batch_size=256,
            num_workers=2,
            persistent_workers=True,
            max_batches=24_000,
            quick_batches=40,
            warmup=10,
            inline_rows=True,
            plain_row=True,
            reference_row=True,
            features_row=True,
            alternatives=True,
            target_main_of_reference=CPU_MAIN_OF_REFERENCE,
            target_workers_of_reference=CPU_WORKERS_OF_REFERENCE,
            target_vs_inline=1.0,
        ),
        WorkloadSpec(
            name="image",
            variants=(AUTO,),
            summary="3x224x224 uint8 image + label, fetch is free; bandwidth dominates",
            kind="throughput",
            make_dataset=lambda n, quick: ImageDataset(n),
            batch_size=64,
            num_workers=2,
            persistent_workers=True,
            max_batches=16_000,
            quick_batches=10,
            warmup=6,
            inline_rows=True,
            plain_row=True,
            reference_row=True,
            features_row=True,
            alternatives=True,
            target_main_of_reference=CPU_MAIN_OF_REFERENCE,
            target_workers_of_reference=CPU_WORKERS_OF_REFERENCE,
        ),
        WorkloadSpec(
            name="fresh",
            summary="image's sample, but a new array each time (pool[i % 16].copy()), as "
            "real datasets make them",
            kind="throughput",
            make_dataset=lambda n, quick: FreshImageDataset(n),
            batch_size=64,
            num_workers=2,
            persistent_workers=True,
            max_batches=16_000,
            quick_batches=10,
            warmup=6,
            inline_rows=True,
            plain_row=True,
            reference_row=True,
            alternatives=True,
            target_main_of_reference=CPU_MAIN_OF_REFERENCE,
            target_workers_of_reference=CPU_WORKERS_OF_REFERENCE,
        ),
        WorkloadSpec(
            name="decode",
            summary="JPEG bytes -> decode, random resized crop to 224x224, random flip, CHW "
            "uint8 (ImageNet training on the CPU, Pillow + NumPy)",
            kind="throughput",
            make_dataset=_decode_dataset,
            batch_size=64,
            num_workers=2,
            persistent_workers=True,
            max_batches=400,
            quick_batches=8,
            warmup=3,
            inline_rows=True,
            plain_row=True,
            plain_label="single process, plain loop",
            reference_row=True,
            alternatives=True,
            machine_target=True,
            target_vs_inline=1.0,
            in_quick=False,
            variants=(
                Variant("2 thread workers", 2, (("worker_method", "thread"),)),
                Variant("num_workers='auto'", "auto"),
            ),
            measure_memory=True,
        ),
        WorkloadSpec(
            name="cpu",
            summary="~1 ms of pure-Python work per sample; scaling across processes",
            kind="throughput",
            make_dataset=_cpu_dataset,
            batch_size=32,
            num_workers=2,
            max_batches=300,
            quick_batches=4,
            warmup=4,
            inline_rows=True,
            plain_row=True,
            plain_label="single process, plain loop",
            alternatives=True,
            target_speedup=1.9,
            target_vs_inline=1.0,
            variants=(AUTO,),
        ),
        WorkloadSpec(
            name="text",
            summary="16-512 int64 token ids per sample, padded per batch by a collate_fn into "
            "input_ids + attention_mask",
            kind="throughput",
            make_dataset=lambda n, quick: TextDataset(n),
            batch_size=64,
            num_workers=2,
            persistent_workers=True,
            max_batches=8_000,
            quick_batches=10,
            warmup=6,
            inline_rows=True,
            plain_row=True,
            collate_fn=pad_collate,
            target_vs_inline=1.7,
            variants=(
                # The same padding, its arrays made by conveyor.collate.zeros: in a worker,
                # in the slot the batch travels in (no copy to send it); in-process,
                # NumPy's: the num_workers=0 row's work exactly.
                Variant(
                    "2 workers, collate into shared memory (conveyor.collate.zeros)",
                    2,
                    (("collate_fn", pad_collate_shared),),
                ),
            ),
        ),
        WorkloadSpec(
            name="big",
            summary="batches of 64-160 MiB, each a different size (float32 samples, batch 16); "
            "a shorter window",
            kind="throughput",
            make_dataset=lambda n, quick: BigDataset(n, 16),
            batch_size=16,
            num_workers=2,
            persistent_workers=True,
            max_batches=60,
            quick_batches=2,
            warmup=3,
            quick_warmup=1,
            min_batches=6,
            inline_rows=True,
            plain_row=True,
            seconds_scale=0.5,
            in_quick=False,
        ),
        WorkloadSpec(
            name="memory",
            summary="float batches of 64x3x224x224 (38.5 MB; a new float32 array per sample) "
            "with 2, 4 and 8 workers: each loader's peak memory, the whole process tree's PSS "
            "sampled through the window and as charged to a memory cgroup",
            kind="memory",
            make_dataset=lambda n, quick: FloatImageDataset(n),
            batch_size=64,
            num_workers=2,
            worker_counts=(2, 4, 8),
            persistent_workers=True,
            max_batches=200,
            quick_batches=3,
            warmup=4,
            quick_warmup=2,
            min_batches=12,
            in_quick=False,
            target_memory_of_torch=1.1,
        ),
        WorkloadSpec(
            name="latency",
            summary="5 ms sleep per sample; 8 workers should overlap to 1600 samples/s",
            kind="throughput",
            make_dataset=lambda n, quick: SleepDataset(n),
            batch_size=16,
            num_workers=8,
            max_batches=400,
            quick_batches=10,
            warmup=16,
            ideal_samples_per_s=8 / 0.005,
            variants=(AUTO,),
        ),
        WorkloadSpec(
            name="remote",
            summary="samples that wait 20 ms (object storage stands in), batch 16: 8 worker "
            "processes against 64 thread workers and 4 processes of 16 threads; ideal: one "
            "sample per 20 ms per worker",
            kind="throughput",
            make_dataset=lambda n, quick: SleepDataset(n, delay_s=0.02),
            batch_size=16,
            num_workers=8,
            persistent_workers=True,
            max_batches=600,
            quick_batches=4,
            warmup=8,
            per_worker_ideal=1 / 0.02,
            variants=(
                Variant("64 thread workers", 64, (("worker_method", "thread"),)),
                Variant("4 processes x 16 threads", 4, (("threads_per_worker", 16),), cores=64),
                Variant("num_workers='auto', threads", "auto", (("worker_method", "thread"),)),
            ),
            in_quick=False,
            measure_memory=True,
        ),
        WorkloadSpec(
            name="train",
            summary="image batches into a training loop whose step takes 5 ms (the host "
            "waiting for a GPU); with an accelerator also pin_memory=True and the copy to it",
            kind="train",
            make_dataset=lambda n, quick: ImageDataset(n),
            batch_size=64,
            num_workers=2,
            persistent_workers=True,
            max_batches=2_000,
            quick_batches=10,
            warmup=6,
            step_s=0.005,
            ideal_samples_per_s=64 / 0.005,
            variants=(THREADS,),
        ),
        WorkloadSpec(
            name="host",
            summary="decode's batches into a training loop whose 5 ms step is Python holding "
            "the GIL, as a host launching GPU work is: how much thread workers in the "
            "training process slow the step (SPDL's finding), against processes",
            kind="train",
            make_dataset=_decode_dataset,
            batch_size=16,
            num_workers=2,
            persistent_workers=True,
            max_batches=400,
            quick_batches=4,
            warmup=4,
            step_s=0.005,
            step_holds_gil=True,
            variants=(
                THREADS,
                Variant("2 processes x 2 threads", 2, (("threads_per_worker", 2),), cores=4),
            ),
            in_quick=False,
            measure_memory=True,
        ),
        *(
            WorkloadSpec(
                name=name,
                summary=_VISION + decoder + " (needs torchvision; skipped without it)",
                kind="throughput",
                make_dataset=_image_folder(torchvision_io=name == "torchvision-io"),
                batch_size=64,
                num_workers=2,
                persistent_workers=True,
                max_batches=400,
                quick_batches=4,
                warmup=3,
                variants=VISION_VARIANTS,
                in_quick=False,
                measure_memory=True,
                target_memory_of_torch=1.1,
            )
            for name, decoder in (
                ("torchvision", "Pillow decodes (ImageFolder's default loader)"),
                ("torchvision-io", "torchvision.io.decode_jpeg decodes into a tensor"),
            )
        ),
        WorkloadSpec(
            name="startup",
            summary="time to first batch, spawn, a list of 1M path strings (--quick: fork, 100k)",
            kind="startup",
            make_dataset=_paths_dataset,
            batch_size=32,
            num_workers=2,
            start_methods=("spawn",),
            quick_start_methods=("fork",),
            fixed_length=1_000_000,
        ),
        WorkloadSpec(
            name="epochs",
            summary="short epochs of tiny (10 batches), new workers each; fork and spawn "
            "(--quick: fork)",
            kind="epochs",
            make_dataset=lambda n, quick: TinyDataset(n),
            batch_size=256,
            num_workers=2,
            persistent_workers=False,
            warmup=1,
            min_batches=2,
            max_batches=500,
            quick_warmup=0,
            quick_batches=3,
            quick_seconds=0.2,
            start_methods=("fork", "spawn"),
            quick_start_methods=("fork",),
            fixed_length=10 * 256,
        ),
        WorkloadSpec(
            name="ray",
            summary="Ray workers against process workers on this machine: decode's cost per "
            "batch through Ray, image batches' MB/s through the object store (needs ray and "
            "Pillow; starts a local Ray cluster; run only when named)",
            kind="ray",
            make_dataset=_decode_dataset,  # and image batches (benchmark/remote.py)
            batch_size=64,
            num_workers=2,
            persistent_workers=True,
            max_batches=400,
            quick_batches=4,
            warmup=3,
            by_default=False,
        ),
    )
}
DEFAULT_WORKLOADS = tuple(name for name, spec in WORKLOADS.items() if spec.by_default)
QUICK_WORKLOADS = tuple(n for n, spec in WORKLOADS.items() if spec.in_quick and spec.by_default)
