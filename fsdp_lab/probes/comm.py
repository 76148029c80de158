"""Collectives per step, counted by torch's CommDebugMode: `comm/<op>_count` lets a user see what a
sharding or accumulation policy costs in communication."""

from __future__ import annotations

import contextlib
from collections import Counter

from torch.distributed.tensor.debug import CommDebugMode

# CommDebugMode reports c10d and functional-collective op packets; group them by what they do.
KINDS = (("all_gather", ("allgather", "all_gather")), ("reduce_scatter", ("reduce_scatter",)), ("all_reduce", ("allreduce", "all_reduce")))


def op_kind(op) -> str:
    name = str(op).split(".")[-1].lower()
    return next((kind for kind, needles in KINDS if any(n in name for n in needles)), name.strip("_"))


class CommCounter:
    def __init__(self):
        self.counts: Counter[str] = Counter()

    def begin_step(self) -> None:
        self.counts = Counter()

    @contextlib.contextmanager
    def measure(self):
        """Count the collectives issued inside. One mode per forward+backward: CommDebugMode's module
        tracker loses its place when a second forward follows a backward in the same mode."""
        mode = CommDebugMode()
        with mode:
            yield
        for op, n in mode.get_comm_counts().items():
            self.counts[op_kind(op)] += n

    def metrics(self) -> dict[str, int]:
        return {f"comm/{kind}_count": self.counts.get(kind, 0) for kind, _ in KINDS} | {
            f"comm/{kind}_count": n for kind, n in self.counts.items() if kind not in dict(KINDS)
        }
