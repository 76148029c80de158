"""The plan's traces side by side. A plan traces the model under fake tensors a few dozen times (the
cost model's shapes per AC mode, then mode=estimate's peak for each candidate shown as fitting), each
independent of the others, and at 8B one trace takes seconds on one core: an 8B float8 plan traces
torchao's casts too, and its runs under layout=auto took 123-137 s from start to finish against
torchtitan's 40-58 s (4xH100, 2026-11-27). Spawned processes, one per CPU core this process may use,
take them side by side.

A pool costs its start (each process imports torch anew), so under plan.workers=0 the first trace
runs here and times the rest: they go to a pool only where that is predicted to finish first. The
tiny models of tests trace in milliseconds and never start one; plan.workers=N starts N regardless."""

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
# 3.2-3.7 s on this project's 2-core CI machine (benchmarks/plan_pool_start.py), rounded up.
POOL_START_S = 4.0


def usable_cpus() -> int:
    """This process's CPUs; torchrun's ranks on a node each plan alike under layout=auto, and share them."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def pool_size(first_s: float, rest: int, cpus: int) -> int:
    """Processes for `rest` traces like one that took `first_s`: 1 (here) unless a pool of up to
    `cpus` finishes them sooner, start included."""
    workers = min(cpus, rest)
    if workers <= 1:
        return 1
    return workers if POOL_START_S + first_s * math.ceil(rest / workers) < first_s * rest else 1


def _quiet() -> None:
    """A pool process's start: the warnings its imports and traces give were given once already, by
    the traces this process ran (the plan's first ones run here)."""
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)


def side_by_side(fn: Callable, calls: list[tuple], workers: int) -> list:
    """[fn(*args) for args in calls], in order, `fn` a module-level function: in plan.workers
    processes (0: as the module docstring says; 1: all here)."""
    results = []
    if workers == 0 and calls:
        start = time.perf_counter()
        results.append(fn(*calls[0]))
        calls = calls[1:]
        workers = pool_size(time.perf_counter() - start, len(calls), usable_cpus())
    workers = min(workers, len(calls))
    if workers <= 1:
        return results + [fn(*args) for args in calls]
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_quiet) as pool:
            return results + [future.result() for future in [pool.submit(fn, *args) for args in calls]]
    except BrokenProcessPool as e:
        raise ConfigError(f"plan.workers: one of {workers} tracing processes died ({e}); plan.workers=1 traces in this process") from None
