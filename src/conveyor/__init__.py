"""conveyor: a drop-in, faster and self-explaining ``torch.utils.data.DataLoader``.

from . import DataLoader   # was: from torch.utils.data import DataLoader
"""

from ._iter.elastic import merge_states
from .collate import default_collate, default_convert, numpy_collate
from .dataset import Dataset, IterableDataset
from .diagnostics.findings import Finding, Report, Severity
from .diagnostics.preflight import check
from .distributed import DistributedSampler
from .errors import (
    BatchesHeldWarning,
    ClusterCapacityWarning,
    ClusterLostError,
    CollateError,
    ConfigError,
    ConveyorError,
    ConveyorWarning,
    DuplicateDataWarning,
    LoaderReplacedWarning,
    MissingDependencyError,
    PreflightWarning,
    SharedMemoryExhaustedError,
    StateError,
    UnpicklableError,
    WorkerCrashedError,
    WorkerError,
    WorkerRestartedWarning,
    WorkerStallWarning,
    WorkerStartupError,
    WorkerTimeoutError,
)
from .loader import DataLoader
from .records import InFlightTask, LoaderStatistics, SkippedSample, WorkerStatistics
from .resources import PerWorker, per_worker
from .sampling import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from .shared_list import SharedList
from .worker_info import WorkerInfo, get_worker_info

__version__ = "0.1.0"

__all__ = [
    "BatchSampler",
    "BatchesHeldWarning",
    "ClusterCapacityWarning",
    "ClusterLostError",
    "CollateError",
    "ConfigError",
    "ConveyorError",
    "ConveyorWarning",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "DuplicateDataWarning",
    "Finding",
    "InFlightTask",
    "IterableDataset",
    "LoaderReplacedWarning",
    "LoaderStatistics",
    "MissingDependencyError",
    "PerWorker",
    "PreflightWarning",
    "RandomSampler",
    "Report",
    "Sampler",
    "SequentialSampler",
    "Severity",
    "SharedList",
    "SharedMemoryExhaustedError",
    "SkippedSample",
    "StateError",
    "SubsetRandomSampler",
    "UnpicklableError",
    "WeightedRandomSampler",
    "WorkerCrashedError",
    "WorkerError",
    "WorkerInfo",
    "WorkerRestartedWarning",
    "WorkerStallWarning",
    "WorkerStartupError",
    "WorkerStatistics",
    "WorkerTimeoutError",
    "check",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "merge_states",
    "numpy_collate",
    "per_worker",
]
