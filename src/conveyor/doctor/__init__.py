"""``conveyor doctor MODULE:OBJECT``: check a dataset, measure it, say what to change.

:func:`load_target` imports a dataset, a function returning one, or a DataLoader.
:func:`examine` runs :func:`conveyor.check`, times samples in-process, sizes one batch,
and loads a few batches at a few worker counts. :func:`advise` (pure) turns the numbers
and findings into advice; :func:`render` prints it all as plain text within 100 columns.
Exit status: 0 when nothing is broken; 1 when the pre-flight found an ERROR or a batch
could not be loaded; 2 when the target cannot be imported or is not a dataset.

Modules: ``target`` (what MODULE:OBJECT names), ``measure`` (the numbers), ``profile``
(their records), ``advice``, ``report`` and ``units`` (the text), ``command`` (the CLI).
"""

from conveyor.doctor.advice import advise
from conveyor.doctor.command import add_arguments, run
from conveyor.doctor.measure import batch_nbytes, examine, run_loader, time_fetches, usable_cpus
from conveyor.doctor.profile import LoaderRun, Profile
from conveyor.doctor.report import render
from conveyor.doctor.target import Target, UsageError, load_target
from conveyor.doctor.units import fmt_bytes, fmt_seconds

__all__ = [
    "LoaderRun",
    "Profile",
    "Target",
    "UsageError",
    "add_arguments",
    "advise",
    "batch_nbytes",
    "examine",
    "fmt_bytes",
    "fmt_seconds",
    "load_target",
    "render",
    "run",
    "run_loader",
    "time_fetches",
    "usable_cpus",
]
