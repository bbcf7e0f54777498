"""Seeing where the time goes: stage timings, the verdict, progress, trace, autotune.

Every stage of a batch is timed as it passes (workers: fetch, collate, send; the main
process: decode, pin, the training loop's wait), at a cost of a few clock reads per
batch. :mod:`.timings` sums them; ``statistics()``, the verdict (:mod:`.verdict`), the
progress line (:mod:`.progress`), the trace (:mod:`.trace`) and ``num_workers="auto"``
(:mod:`.autotune`) all read the same figures.
"""
