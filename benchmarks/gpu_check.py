"""Does a real training loop on a GPU wait for its data? ``python benchmarks/gpu_check.py``

The ``train`` workload's batches (64 images of 3x224x224 uint8, 2 persistent workers),
through conveyor's ``DataLoader`` and torch's, each under ``fork`` and ``spawn``, with
``pin_memory=True``, into a small convolutional network trained on the GPU: each batch
is copied with ``non_blocking=True``, normalised there, and one SGD step is taken. The
loop's time in ``next()`` is summed apart from the rest; after the warm-up the GPU's
stream is synchronised once a step, so a step's time is the GPU's (a loader that keeps
up leaves ``next()`` nearly free). Prints one Markdown table: samples/s, the share of
the loop spent waiting for data, the GPU step's mean time, and a verdict per row.

Needs torch with CUDA and a CUDA device; without one it says so and exits with status 2
(nothing measured). ``--seconds`` sets each timed window (default 5), ``--batches`` its
least number of batches (default 50), ``--model`` the network's width (default 64
channels: a step of a few milliseconds on a current GPU). ``--device cpu`` runs the same
loop on the CPU: a check of this script, saying nothing of a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

NO_CUDA = 2  # exit status: no device, nothing measured
# A loop "waits for data" when more than this share of it is spent in next().
WAITING_SHARE = 0.05


@dataclass
class Result:
    loader: str
    method: str
    samples_per_s: float
    waited_share: float
    step_ms: float

    @property
    def verdict(self) -> str:
        if self.waited_share > WAITING_SHARE:
            return f"waited for data ({self.waited_share:.0%} of the loop in next())"
        return "kept the GPU fed"


def _torch(device: str) -> Any:
    """torch with the device (CUDA unless asked for the CPU), or None (the reason printed)."""
    try:
        import torch
    except ImportError:
        print("gpu_check: torch is not installed; this check needs torch with CUDA.")
        return None
    if device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here (torch.cuda.is_available() is False, torch "
            f"{torch.__version__}); this check needs one. Nothing was measured."
        )
        return None
    return torch


def _model(torch: Any, width: int) -> Any:
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, width, 7, stride=2, padding=3),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(2 * width, 4 * width, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, 1000),
    )


def _run(
    torch: Any, make: Callable[[], Any], args: argparse.Namespace
) -> tuple[float, float, float]:
    """Train over one loader: samples/s, the share of the loop in next(), ms a step."""
    device, width, seconds, least = (
        torch.device(args.device),
        args.model,
        args.seconds,
        args.batches,
    )
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model = _model(torch, width).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    def step(batch: Any) -> None:
        images, labels = batch
        x = (images.to(device, non_blocking=True).float() - mean) / std
        y = labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()
        synchronize()  # the step's time is the device's

    it = iter(make())
    for _ in range(10):  # workers started, pinning thread up, kernels chosen
        step(next(it))
    waited = stepping = 0.0
    batches = samples = 0
    start = time.perf_counter()
    while batches < least or time.perf_counter() - start < seconds:
        asked = time.perf_counter()
        batch = next(it)
        got = time.perf_counter()
        step(batch)
        waited += got - asked
        stepping += time.perf_counter() - got
        samples += len(batch[1])
        batches += 1
        del batch
    elapsed = time.perf_counter() - start
    del it
    return samples / elapsed, waited / elapsed, 1000 * stepping / batches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--model", type=int, default=64, help="the network's width")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)
    torch = _torch(args.device)
    if torch is None:
        return NO_CUDA
    import conveyor
    from conveyor_bench.specs import WORKLOADS  # the train workload's data and settings

    spec = WORKLOADS["train"]
    batches = args.batches + 20 + int(args.seconds * 400)
    dataset = spec.make_dataset(batches * spec.batch_size, False)
    loaders = {"conveyor": conveyor.DataLoader, "torch": torch.utils.data.DataLoader}
    results: list[Result] = []
    for method in ("fork", "spawn"):
        for name, cls in loaders.items():

            def make(cls: Any = cls, method: str = method) -> Any:
                return cls(
                    dataset, batch_size=spec.batch_size, num_workers=spec.num_workers,
                    persistent_workers=True, pin_memory=True, multiprocessing_context=method,
                )  # fmt: skip

            runs = [_run(torch, make, args) for _ in range(max(1, args.repeat))]
            rate, waited, step_ms = (statistics.median(r[i] for r in runs) for i in range(3))
            results.append(Result(name, method, rate, waited, step_ms))
            print(f"  {name} {method}: {rate:,.0f} samples/s", file=sys.stderr)
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "the CPU (a dry run)"
    print(f"# GPU check: the train workload on {device}, a {args.model}-wide conv net\n")
    print("| loader | start method | samples/s | waiting in next() | GPU step ms | verdict |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.loader} | {r.method} | {r.samples_per_s:,.0f} | {r.waited_share:.1%} | "
            f"{r.step_ms:.2f} | {r.verdict} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
