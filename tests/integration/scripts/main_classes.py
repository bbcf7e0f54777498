"""Classes of the training script itself, coming back from the workers.

Usage: ``main_classes.py LOADER METHOD`` (LOADER ``conveyor`` or ``torch``), as a file or
read from standard input (``python - conveyor spawn < main_classes.py``). Prints one JSON
line: what the batches and the error were, as this script sees them.

A namedtuple (collated by the default collate, which keeps its type), a plain class (a
collate_fn keeps the samples) and an exception class, all defined here, in ``__main__``.
"""

import collections
import json
import sys

Point = collections.namedtuple("Point", "x y")


class Box:
    def __init__(self, value):
        self.value = value

    def doubled(self):
        return 2 * self.value


class BadSample(Exception):
    def describe(self):
        return "a BadSample"


ORIGINALS = (Box.doubled, BadSample.describe)


class Points:
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return Point(index, index * index)


class Boxes:
    def __len__(self):
        return 4

    def __getitem__(self, index):
        if index == 3:
            raise BadSample(index)
        return Box(index)


def keep_samples(batch):
    return list(batch)


def make_loader(dataset, **kwargs):
    kind, method = sys.argv[1], sys.argv[2]
    if kind == "torch":
        from torch.utils.data import DataLoader
    else:
        from conveyor import DataLoader
    return DataLoader(
        dataset, batch_size=2, num_workers=2, multiprocessing_context=method, **kwargs
    )


def main():
    report = {"points": [], "boxes": [], "error": None}
    for batch in make_loader(Points()):
        report["points"].append(
            {"is_point": type(batch) is Point, "x": batch.x.tolist(), "y": batch.y.tolist()}
        )
    try:
        for batch in make_loader(Boxes(), collate_fn=keep_samples):
            report["boxes"].append([[type(b) is Box, b.doubled()] for b in batch])
    except BadSample as exc:
        report["error"] = {"caught": type(exc) is BadSample, "describe": exc.describe()}
    report["classes_unchanged"] = (Box.doubled, BadSample.describe) == ORIGINALS
    print(json.dumps(report))


if __name__ == "__main__":
    main()
