"""A workload's rows put in context: shares of the plain and reference loops, speedups over
torch, the alternatives and ``num_workers=0``, each against the target the project set for
it, and every loader's own CPU per batch."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from conveyor_bench.machine import MachineCheck
from conveyor_bench.measure import SETTLE_LIMIT_S, Measurement
from conveyor_bench.rows import ALTERNATIVES, INLINE_CONFIG, LOADERS, PLAIN, REFERENCE, Row
from conveyor_bench.specs import WorkloadSpec

ALL = (*LOADERS, *ALTERNATIVES)


def _percent(value: float) -> str:
    return f"{value:.0%}"


def _times(value: float) -> str:
    return f"{value:.2f}x"


def against(value: float, target: float | None, show: Callable[[float], str]) -> str:
    """``value`` shown, with its target beside it, saying plainly when it misses it."""
    if target is None:
        return show(value)
    wanted = f"target >= {show(target).replace('.00x', 'x')}"
    return f"{show(value)} ({wanted})" if value >= target else f"{show(value)} (below {wanted})"


def at_most(value: float, target: float | None) -> str:
    """A ratio where lower is better, with its ceiling beside it, saying when it is over."""
    if target is None:
        return _times(value)
    wanted = f"target <= {target:g}x"
    return f"{_times(value)} ({wanted})" if value <= target else f"{_times(value)} (over {wanted})"


def _rate(row: Row, loader: str) -> str:
    """A row's median samples/s for a note, with its spread over the rounds if any."""
    spread = row.spread(loader)
    text = f"{row.median(loader) or 0:,.0f} samples/s"
    return text if spread is None else f"{text} ±{spread:.0%}"


def _shares(
    row: Row,
    base: float,
    show: Callable[[float], str],
    target: float | None = None,
    loaders: tuple[str, ...] = ALL,
) -> str:
    """Each loader's median over ``base``; conveyor's against ``target``."""
    parts = []
    for name in loaders:
        if (value := row.median(name)) is None:
            continue
        share = value / base
        parts.append(f"{name} {against(share, target if name == 'conveyor' else None, show)}")
    return ", ".join(parts)


def annotate(spec: WorkloadSpec, rows: list[Row]) -> None:
    """Add each row's notes, and its loaders' own CPU per batch (``loader_cpu``)."""
    plain = next((r for r in rows if r.kind == "baseline"), None)
    base = plain.median(PLAIN) if plain else None
    machine = plain.machine if plain else None
    reference_row = next((r for r in rows if r.kind == "reference"), None)
    reference = reference_row.median(REFERENCE) if reference_row else None
    inline = next((r for r in rows if r.config == INLINE_CONFIG), None)
    workers = next((r for r in rows if r.kind == "throughput" and r is not inline), None)
    loader_cpu(rows)
    for row in rows:
        mine = workers.median("conveyor") if workers else None
        if row.kind == "features" and mine and (v := row.median("conveyor")):
            row.notes.append(f"of the same loader without them: {against(v / mine, 0.9, _percent)}")
        if row is workers:
            row.notes.extend(_workers_notes(spec, row, base, reference, inline, machine))
            if reference_row is not None and (cpu := cpu_of_reference(spec, row, reference_row)):
                row.notes.append(cpu)
        elif row is inline and base:
            row.notes.append(f"of plain loop: {_shares(row, base, _percent)}")
        elif row.kind == "reference" and reference:
            row.notes.append(
                f"{_rate(row, REFERENCE)}; the design's limit here: workers write samples "
                "into shared memory, views to the consumer, nothing else"
            )
        elif row.kind == "baseline" and base:
            row.notes.append(f"{_rate(row, PLAIN)}; no loader: index + collate by hand (NumPy)")
            if machine:
                row.notes.append(
                    f"machine check: {machine.processes} bare processes of this work ran "
                    f"{machine.speedup:.2f}x one (the most {machine.processes} workers can "
                    "reach here)"
                )
        elif row.kind == "startup":
            row.notes.append("time to first batch, lower is better; ratio = torch / conveyor")
        elif row.kind == "epochs":
            row.notes.append(
                "time an epoch takes, its workers' start-up included, lower is better; "
                "ratio = torch / conveyor"
            )
        if row.kind == "train" or (row.kind == "variant" and spec.kind == "train"):
            row.notes.extend(_training_notes(row))
        if row.kind == "variant":
            row.notes.extend(_variant_notes(spec, row, mine, inline))
        ideal = spec.ideal_samples_per_s
        if spec.per_worker_ideal and row.kind in ("throughput", "variant"):
            count = _worker_count(spec, row)
            ideal = count * spec.per_worker_ideal if count else None
        if ideal and row.kind in ("throughput", "train", "variant"):
            row.notes.append(f"of ideal {ideal:,.0f}/s: {_shares(row, ideal, _percent)}")
        row.notes.extend(_memory_notes(row, workers))
        if row.kind == "memory":
            row.notes.extend(_peak_notes(spec, row))
        else:
            row.notes.extend(_charged_notes(spec, row))
        for name, runs in row.runs.items():
            leaked = max(m.leaked_processes for m in runs)
            if leaked:
                row.notes.append(f"{name}: {leaked} process(es) outlived the loader")
        row.notes.extend(f"{name} failed: {error}" for name, error in row.errors.items())


def _variant_notes(
    spec: WorkloadSpec, row: Row, mine: float | None, inline: Row | None
) -> list[str]:
    """A row of conveyor alone with other settings: against conveyor's workers row and its
    num_workers=0 row; how long num_workers="auto" took to settle."""
    notes = []
    if mine and (v := row.median("conveyor")):
        notes.append(f"{v / mine:.2f}x conveyor's workers row above")
        if inline is not None and (alone := inline.median("conveyor")):
            notes.append(
                f"vs its num_workers=0: {against(v / alone, spec.target_vs_inline, _times)}"
            )
    if _worker_count(spec, row) is None:
        notes.extend(_settle_notes(row.runs.get("conveyor", [])))
    return notes


def _pss(row: Row, loader: str, figure: str = "loader_pss_bytes") -> float | None:
    """The median of a memory figure (MiB) of a row's runs for ``loader``; None if unread."""
    values = [v for m in row.runs.get(loader, []) if (v := getattr(m, figure)) is not None]
    return statistics.median(values) / 2**20 if values else None


def _peak_notes(spec: WorkloadSpec, row: Row) -> list[str]:
    """The memory each loader added at its peak (PSS of the whole process tree, sampled
    through the window), and conveyor's over torch's."""
    peaks = {name: _pss(row, name, "peak_pss_bytes") for name in ALL}
    found = {name: mib for name, mib in peaks.items() if mib is not None}
    if not found:
        return []
    samples = min(m.pss_samples for runs in row.runs.values() for m in runs)
    text = ", ".join(f"{name} {mib:,.0f} MiB" for name, mib in found.items())
    notes = [f"peak memory the loader added (PSS, whole tree, >= {samples} readings): {text}"]
    mine, theirs = found.get("conveyor"), found.get("torch")
    charged = {name: _pss(row, name, "charged_peak_bytes") for name in ALL}
    if all(charged.get(name) is not None for name in found):
        text = ", ".join(f"{name} {charged[name]:,.0f} MiB" for name in found)
        notes.append(f"as charged to a memory cgroup (shared memory mapped or not): {text}")
        mine, theirs = charged.get("conveyor"), charged.get("torch")
    if mine is not None and theirs:
        notes.append(f"conveyor over torch: {at_most(mine / theirs, spec.target_memory_of_torch)}")
    return notes


def _charged_notes(spec: WorkloadSpec, row: Row) -> list[str]:
    """The peak memory each loader added as charged to a memory cgroup (rows that
    measure memory, where one could be made): PSS read at the window's end misses what
    torch's workers hold only between batches (samples, shared memory in transit); the
    kernel's peak does not. conveyor's over torch's against the workload's target."""
    charged = {name: _pss(row, name, "charged_peak_bytes") for name in ALL}
    found = {name: mib for name, mib in charged.items() if mib is not None}
    if not found:
        return []
    text = ", ".join(f"{name} {mib:,.0f} MiB" for name, mib in found.items())
    notes = [f"peak as charged to a memory cgroup: {text}"]
    mine, theirs = found.get("conveyor"), found.get("torch")
    if mine is not None and theirs:
        notes.append(f"conveyor over torch: {at_most(mine / theirs, spec.target_memory_of_torch)}")
    return notes


def _memory_notes(row: Row, workers: Row | None) -> list[str]:
    """The memory each loader added by the window's end, as PSS (a page shared by
    several processes counted once): this process's growth and its workers'."""
    parts = []
    for name in ALL:
        added = _pss(row, name)
        if added is None:
            continue
        in_workers = _pss(row, name, "workers_pss_bytes") or 0.0
        where = (
            f"workers {in_workers:,.0f}, this process {added - in_workers:+,.0f}"
            if in_workers
            else "all in this process"
        )
        parts.append(f"{name} {added:,.0f} MiB ({where})")
    if not parts:
        return []
    text = ", ".join(parts)
    mine, theirs = _pss(row, "conveyor"), _pss(workers, "conveyor") if workers else None
    if row.kind == "variant" and mine and theirs:
        text += f"; {mine / theirs:.2f}x the workers row's"
    # A forked worker shares its parent's pages: PSS splits them, so this process's own
    # figure falls as its workers' rises; the sum is what the loader cost.
    return [f"memory the loader added (PSS, shared pages split): {text}"]


def _settle_notes(runs: list[Measurement]) -> list[str]:
    """num_workers="auto": how long its count took to settle (the window is timed after)."""
    runs = [m for m in runs if m.waited_to_settle]  # a quick run does not wait for it
    if not runs:
        return []
    settled = [m.settled_after_s for m in runs if m.settled_after_s is not None]
    if len(settled) < len(runs):
        return [
            f"auto settled in {len(settled)} of {len(runs)} runs within {SETTLE_LIMIT_S:.0f} s; "
            "the others were timed while it adapted"
        ]
    counts = sorted({m.settled_workers for m in runs if m.settled_workers is not None})
    at = f" at {'/'.join(map(str, counts))} workers" if counts else ""
    return [f"auto settled{at} after {statistics.median(settled):.1f} s (median), timed after"]


def _workers_notes(
    spec: WorkloadSpec,
    row: Row,
    base: float | None,
    reference: float | None,
    inline: Row | None,
    machine: MachineCheck | None,
) -> list[str]:
    """The workers row: against the reference loop, torch, num_workers=0, the plain loop
    and the alternatives; conveyor's figures against the workload's targets."""
    notes = []
    if reference:
        shares = _shares(row, reference, _percent, spec.target_of_reference)
        notes.append(f"of reference loop: {shares}")
    if (ratio := row.ratio()) is not None:
        notes.append(f"vs torch: {against(ratio, spec.target_vs_torch, _times)}")
    if inline is not None:
        parts = []
        for name in LOADERS:
            if (value := row.median(name)) and (alone := inline.median(name)):
                target = spec.target_vs_inline if name == "conveyor" else None
                parts.append(f"{name} {against(value / alone, target, _times)}")
        if parts:
            notes.append(f"vs its num_workers=0: {', '.join(parts)}")
    if base:
        speedup = machine.speedup if machine else None
        if spec.machine_target and speedup:
            shares = _shares(row, base, _times, round(speedup, 2))
            notes.append(f"vs single process: {shares} (target: the machine check)")
        elif spec.target_speedup:
            shares = _shares(row, base, _times, spec.target_speedup)
            check = f"; machine check {speedup:.2f}x" if speedup else ""
            notes.append(f"vs single process: {shares}{check}")
        else:
            notes.append(f"of plain loop: {_shares(row, base, _percent)}")
    others = [f"{name} {r:.2f}x" for name in ALTERNATIVES if (r := row.ratio(name))]
    if others:
        notes.append(f"conveyor vs {', '.join(others)}")
    return notes  # a loader that is not installed says so in its cell


CPU_FIGURES = (("main", "main_cpu_ms_per_batch"), ("workers", "workers_cpu_ms_per_batch"))


def cpu_of_reference(spec: WorkloadSpec, row: Row, reference: Row) -> str | None:
    """Each loader's CPU per batch over the reference loop's, the main process's and the
    workers' apart; conveyor's against the workload's ceilings (lower is better)."""
    targets = {
        "main": spec.target_main_of_reference,
        "workers": spec.target_workers_of_reference,
    }
    parts = []
    for side, figure in CPU_FIGURES:
        if not (theirs := reference.per_batch(REFERENCE, figure)):
            continue
        each = [
            f"{name} {at_most(mine / theirs, targets[side] if name == 'conveyor' else None)}"
            for name in ALL
            if name not in row.errors and (mine := row.per_batch(name, figure)) is not None
        ]
        if each:
            parts.append(f"{side} {', '.join(each)}")
    return f"CPU per batch over the reference loop's: {'; '.join(parts)}" if parts else None


def loader_cpu(rows: list[Row]) -> None:
    """Each loader's own CPU per batch: all the CPU a batch cost (main process and
    workers) less what the same work costs without a loader, the plain loop's. For rows
    with workers that is the machine check's CPU per batch (the plain loop in as many bare
    processes side by side, which pay the same for sharing cores), else the plain loop's
    alone. Rows with no plain loop get none."""
    plain = next((r for r in rows if r.kind == "baseline"), None)
    if plain is None or (alone := plain.per_batch(PLAIN, "main_cpu_ms_per_batch")) is None:
        return
    side_by_side = plain.machine.parallel_cpu_ms_per_batch if plain.machine else None
    for row in rows:
        if row.kind not in ("throughput", "features", "reference"):
            continue
        work = alone if row.config == INLINE_CONFIG else (side_by_side or alone)
        for name in row.runs:
            if name in row.errors:
                continue
            if (total := row.per_batch(name, "total_cpu_ms_per_batch")) is not None:
                row.loader_cpu_ms[name] = total - work


def _training_notes(row: Row) -> list[str]:
    """How long the training loop waited for data, and how fast batches reached the
    accelerator (median over the rounds)."""
    waited, copies = [], []
    for name in LOADERS:
        runs = row.runs.get(name)
        if not runs or name in row.errors:
            continue
        waited.append(f"{name} {statistics.median(m.waited_share for m in runs):.1%}")
        rates = [rate for m in runs if (rate := m.copy_bytes_per_s) is not None]
        if rates:
            copies.append(f"{name} {statistics.median(rates) / 1e9:.1f} GB/s")
    notes = [f"waiting for data: {', '.join(waited)} of the loop"] if waited else []
    steps = [
        f"{name} {statistics.median(ms):.1f} ms"
        for name in LOADERS
        if (ms := [m.step_ms for m in row.runs.get(name, []) if m.step_ms is not None])
    ]
    if steps:
        notes.append(f"a training step took: {', '.join(steps)}")
    if copies:
        notes.append(f"copy to the accelerator: {', '.join(copies)}")
    return notes


def _worker_count(spec: WorkloadSpec, row: Row) -> int | None:
    """The workers a row ran with (None: "auto", or none)."""
    if row.kind == "throughput":
        return spec.num_workers if row.config != INLINE_CONFIG else None
    variant = next((v for v in spec.variants if v.label == row.config), None)
    if variant is not None and variant.cores is not None:
        return variant.cores
    return variant.workers if variant is not None and isinstance(variant.workers, int) else None
