"""The pre-flight: what would break in the workers, found before they start, with the fix.

``target`` is what is checked (a dataset, or a loader's: conveyor's or torch's). One
walker (``paths``, ``walk``) visits the dataset, ``collate_fn`` and
``worker_init_fn``; the checks are ``pickling`` (what will not pickle, by attribute
path), ``handle_hazards`` and ``handles`` (open files, connections and raw descriptors a
fork would share), ``fork_hazards`` (containers, random generators, threads, CUDA),
``thread_hazards``, ``torch_draws``, ``epoch_hazards`` (a ``set_epoch`` that would not
reach persistent workers) and ``environment``; ``findings`` and ``fixes`` are
the report. ``preflight.check`` is public as :func:`conveyor.check`.
"""
