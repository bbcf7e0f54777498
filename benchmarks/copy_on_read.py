"""Copy-on-read: the memory forked workers copy from a dataset's list of 1M paths.

    python benchmarks/copy_on_read.py                      # ~1 min on 2 cores
    python benchmarks/copy_on_read.py --items 200000 --start-method spawn
    python benchmarks/copy_on_read.py --collect 100000     # with full garbage collections

A dataset holds 1M path strings and returns ``len(path)``; 2 persistent workers
make one full pass. Each loader / container pair runs in a fresh interpreter;
at the end of the epoch, while the workers are still alive, the script sums
their USS (memory only they hold: what they copied or allocated) and prints a
Markdown table (stdout). A plain list is copied page by page as workers read
it (each read writes the string's reference count); a ``conveyor.SharedList``
is only read. With ``--collect N`` each worker runs a full garbage collection every N
samples, as the collector eventually does in a long run: it writes to every object it
visits. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

import psutil

CONFIGS = [
    ("torch", "list"),
    ("conveyor", "list"),
    ("conveyor", "SharedList"),
    ("torch", "SharedList"),
]
_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
MIB = 2**20


class Paths:
    """Sample ``i``: the length of path ``i`` (reading it is all the work); a full garbage
    collection every ``collect_every`` samples (0: never)."""

    def __init__(self, paths: Any, collect_every: int = 0) -> None:
        self.paths = paths
        self.collect_every = collect_every

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> int:
        if self.collect_every and index % self.collect_every == 0:
            gc.collect()
        return len(self.paths[index])


def make_paths(n: int) -> list[str]:
    return [
        f"/datasets/imagenet/train/n{i % 1000:08d}/n{i % 1000:08d}_{i:08d}.JPEG" for i in range(n)
    ]


def worker_pids() -> list[int]:
    """Live worker processes of this process (under forkserver: the server's children)."""
    me = psutil.Process()
    pids = []
    for proc in me.children(recursive=True):
        try:
            if proc.ppid() == me.pid and any(h in " ".join(proc.cmdline()) for h in _HELPERS):
                continue
            if proc.status() != psutil.STATUS_ZOMBIE:
                pids.append(proc.pid)
        except psutil.Error:
            continue
    return pids


def measure(loader_name: str, container: str, args: argparse.Namespace) -> dict[str, Any]:
    """One pass in this (fresh) interpreter; the workers' USS at its end."""
    if loader_name == "torch":
        from torch.utils.data import DataLoader
    else:
        from conveyor import DataLoader  # type: ignore[assignment]
    from conveyor import SharedList

    paths: Any = make_paths(args.items)
    expected = sum(map(len, paths))
    if container == "SharedList":
        paths = SharedList(paths)
    dataset = Paths(paths, args.collect)
    del paths
    gc.collect()
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        num_workers=args.workers,
        persistent_workers=True,
        multiprocessing_context=args.start_method,
    )
    start = time.perf_counter()
    total = 0
    for batch in loader:
        total += int(batch.sum())
    seconds = time.perf_counter() - start
    if total != expected:
        raise SystemExit(f"wrong data: the lengths add up to {total}, not {expected}")
    pids = worker_pids()
    uss = [psutil.Process(pid).memory_full_info().uss for pid in pids]
    del loader
    return {
        "loader": loader_name,
        "container": container,
        "workers": len(pids),
        "uss": uss,
        "seconds": seconds,
    }


def run_isolated(loader_name: str, container: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--measure",
        f"{loader_name}:{container}",
        "--items",
        str(args.items),
        "--workers",
        str(args.workers),
        "--batch-size",
        str(args.batch_size),
        "--start-method",
        args.start_method,
        "--collect",
        str(args.collect),
    ]
    print(f"{loader_name} + {container} ...", file=sys.stderr, flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"loader": loader_name, "container": container, "error": done.stderr.strip()[-300:]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    reference = next(
        (
            sum(r["uss"])
            for r in results
            if (r["loader"], r["container"]) == CONFIGS[0] and "uss" in r
        ),
        None,
    )
    lines = [
        f"{args.items:,} paths, {args.workers} workers, `{args.start_method}`, batch size "
        f"{args.batch_size}, one pass"
        + (f", a full garbage collection every {args.collect:,} samples" if args.collect else "")
        + f"; {os.cpu_count()} cores, Python {sys.version.split()[0]}",
        "",
        "| loader | dataset holds | workers' USS (MiB) | per worker (MiB) | % of torch + list | epoch s |",  # noqa: E501
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        name = f"{r['loader']} | `{r['container']}`"
        if "uss" not in r:
            lines.append(f"| {name} | error | | | |")
            print(f"{name}: {r['error']}", file=sys.stderr)
            continue
        total = sum(r["uss"]) / MIB
        share = f"{100 * sum(r['uss']) / reference:.0f}%" if reference else "-"
        each = " / ".join(f"{u / MIB:.0f}" for u in r["uss"])
        lines.append(f"| {name} | {total:.0f} | {each} | {share} | {r['seconds']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--start-method", default="fork", choices=["fork", "spawn", "forkserver"])
    parser.add_argument(
        "--collect", type=int, default=0, metavar="N", help="full gc.collect() every N samples"
    )
    parser.add_argument("--only", help="comma-separated loader:container pairs, e.g. torch:list")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: one run, JSON out
    args = parser.parse_args(argv)
    if args.measure:
        loader_name, container = args.measure.split(":")
        print(json.dumps(measure(loader_name, container, args)))
        return 0
    configs = CONFIGS
    if args.only:
        configs = [tuple(pair.split(":")) for pair in args.only.split(",")]  # type: ignore[misc]
    try:
        import torch  # noqa: F401
    except ImportError:
        configs = [c for c in configs if c[0] != "torch"]
        print("torch is not installed: conveyor rows only", file=sys.stderr)
    results = [run_isolated(loader_name, container, args) for loader_name, container in configs]
    print(report(results, args))
    return 0 if all("uss" in r for r in results) else 1


if __name__ == "__main__":  # guard: spawned workers re-import this file as __mp_main__
    raise SystemExit(main())
