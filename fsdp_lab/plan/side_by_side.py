"""The plan's traces side by side. A plan traces the model under fake tensors a few dozen times (the
cost model's shapes per AC mode, then mode=estimate's peak for each candidate shown as fitting), each
independent of the others, and at 8B one trace takes seconds on one core: an 8B float8 plan traces
torchao's casts too, and its runs under layout=auto took 123-137 s from start to finish against
torchtitan's 40-58 s (4xH100, 2026-11-27). Spawned processes, one per CPU core this process may use,
take them side by side: the cost model's traces, then the estimates, in one pool.

A pool costs its start (each process imports torch anew), so under plan.workers=0 the first traces
run here, and the first in a warm process (past the imports the first one pays) times the rest: they
go to a pool only where that is predicted to finish first. The tiny models of tests trace in
milliseconds and never start one; plan.workers=N starts N regardless."""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Callable

from fsdp_lab.config import ConfigError

# Seconds a spawned pool adds to its traces (torch, the lab and torchao imported in each process):
# 2.8-3.7 s in four runs on this project's 2-core CI machine (benchmarks/plan_pool_start.py), rounded up.
POOL_START_S = 4.0


def usable_cpus() -> int:
    """This process's CPUs; torchrun's ranks on a node each plan alike under layout=auto, and share them."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def pool_gains(first_s: float, rest: int, cpus: int) -> bool:
    """Whether a pool of up to `cpus` processes finishes `rest` traces like one that took `first_s`
    sooner than this process would, its start included."""
    workers = min(cpus, rest)
    return workers > 1 and POOL_START_S + first_s * math.ceil(rest / workers) < first_s * rest


def _quiet() -> None:
    """A pool process's start: the warnings its imports and traces give were given once already, by
    the traces this process ran (the plan's first ones run here)."""
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)


class SideBySide:
    """[fn(*args) for args in calls] per batch, in order, `fn` a module-level function: in plan.workers
    processes (0: as the module docstring says; 1: all here). One pool serves every batch of a plan
    (the cost model's traces, then each round of estimates), so its start is paid once; it starts at
    the first batch that gains by it, and each of its processes only when a call waits for one."""

    def __init__(self, workers: int):
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._size = 0
        self._warm = False  # a call ran here

    def __enter__(self) -> SideBySide:
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def map(self, fn: Callable, calls: list[tuple]) -> list:
        calls, here = list(calls), []
        if self._pool is None:
            size = self.workers
            if size == 0:
                # Calls run here until one has run in a warm process (past the imports the first one
                # pays): its time says whether a pool gains on the rest.
                while calls:
                    start = time.perf_counter()
                    here.append(fn(*calls.pop(0)))
                    warm, self._warm = self._warm, True
                    if warm:
                        break
                size = usable_cpus() if calls and pool_gains(time.perf_counter() - start, len(calls), usable_cpus()) else 1
            if min(size, len(calls)) <= 1:
                return here + [fn(*args) for args in calls]
            self._pool, self._size = ProcessPoolExecutor(size, mp_context=multiprocessing.get_context("spawn"), initializer=_quiet), size
        try:
            return here + [future.result() for future in [self._pool.submit(fn, *args) for args in calls]]
        except BrokenProcessPool as e:
            raise ConfigError(f"plan.workers: one of {self._size} tracing processes died ({e}); plan.workers=1 traces in this process") from None
