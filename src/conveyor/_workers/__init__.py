"""Workers: one :class:`~.core.WorkerCore` and a shell and a pool for each kind of worker.

The loop reaches a kind only through ``kinds`` (each kind a frozen ``WorkerKind`` value);
what every kind shares is ``api`` (the pool protocol: send, wait, restart, close),
``core`` and ``spec`` (what a core is given), ``scope`` (what belongs to one core rather
than its process: worker info, seeds, ``per_worker`` handles) and ``thread_draws``.
Processes: ``pool``, ``process``, ``loop``, ``start``, ``status``, ``teardown``...;
threads: ``threads``, ``thread_exit``; Ray: ``ray_pool``, ``ray_actor``, ``ray_cluster``.
"""
