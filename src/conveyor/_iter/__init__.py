"""The main process's side: iterators over a loader, and the pure objects that decide.

``multiprocess`` (the loop with workers: I/O only) and ``inline`` (``num_workers=0``)
start each epoch through ``epoch.EpochStart``; ``epoch_news`` is what workers start a
later epoch with (the dataset's ``set_epoch``..., a DataPipe's seed). What decides is
pure and table-tested: ``book`` (the TaskBook), ``ledger`` and ``facts``, ``crashes``
(the CrashJudge), ``deadlines``, ``run_ahead``, ``skips``; ``supervisor`` does their
I/O. Checkpoints: ``state`` and ``parse_state``; ranks: ``sharding``, ``elastic``,
``share``.
"""
