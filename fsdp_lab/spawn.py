"""Spawn a run's ranks on this machine through torch elastic (the API torchrun is built on)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch
from torch.numa.binding import AffinityMode, NumaOptions

from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.dist import RANK_STORE_DIR, is_rank_process, resolve_device_type
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.worker import rank_main


class RankFailed(RuntimeError):
    """A rank of the run failed; the message names it and its error."""


class Interrupted(RuntimeError):
    """The run was stopped by a signal (Ctrl-C, SIGTERM) sent to the launching process."""


def describe_failure(err: ChildFailedError) -> str:
    rank, failure = err.get_first_failure()
    if failure.exitcode < 0:
        return f"rank {rank} died from signal {failure.signal_name()}"
    if not os.path.isfile(failure.error_file):  # it exited without raising: elastic's message is boilerplate
        return f"rank {rank} failed: exit code {failure.exitcode}"
    message = failure.message
    if isinstance(message, dict):  # the error file written by record_failure: {"message": "Type: text", ...}
        message = message.get("message", "")
    message = str(message).strip().splitlines()[0] if message else f"exit code {failure.exitcode}"
    return f"rank {rank} failed: {message}"


def child_start_method(device_type: str) -> str:
    """How to start a process that runs ranks on `device_type`: forked on CPU, so it starts with torch
    and the lab already imported (most of a rank's start-up, seconds each); spawned for GPUs, since
    CUDA cannot be used in a forked child. Before a fork this process's buffered output is flushed,
    which the child would otherwise write a second time."""
    if device_type == "cuda":
        return "spawn"
    sys.stdout.flush()
    sys.stderr.flush()
    return "fork"


def _forked_rank_main(run: RunConfig, run_dir: str, dims: ParallelDims) -> None:
    """A forked rank starts from the launcher's state: give it what a fresh process has, so it logs
    and reacts to signals as a spawned rank does."""
    logging.getLogger().handlers.clear()  # Hydra's handlers: rank_main sets up its own
    signal.signal(signal.SIGINT, signal.default_int_handler)  # not the agent's handlers
    for sig in (signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    rank_main(run, run_dir, dims)


def spawn_ranks(run: RunConfig, dims: ParallelDims, run_dir: Path) -> None:
    """Run `rank_main` on `dims.world_size` local ranks; raises RankFailed naming the first failure."""
    start_method = child_start_method(resolve_device_type(run.device))
    entry = _forked_rank_main if start_method == "fork" else rank_main
    launch(entry, (run, str(run_dir), dims), n=dims.world_size, run_dir=run_dir,
           max_restarts=run.launch.max_restarts, start_method=start_method, numa_binding=run.launch.numa_binding)


def _with_launch_threads(entry):
    """A forked rank inherits this process's intra-op thread pool, sized when torch was imported,
    before launch() set OMP_NUM_THREADS: size it as a freshly started rank would size its own (else
    every rank runs one thread per core, and ranks sharing the cores oversubscribe them)."""
    @functools.wraps(entry)
    def rank(*args):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        return entry(*args)
    return rank


@contextlib.contextmanager
def _rank_store_dir():
    """The ranks of this launch meet on a FileStore in a directory of its own (fsdp_lab.dist.rank_store),
    not on a TCP store: the static rendezvous gives the ranks no port (MASTER_PORT=0); the dynamic one
    gave them a port it found free and let go, which another process can take before rank 0 listens on
    it (EADDRINUSE, seen with this suite's two workers launching runs side by side); and ranks meeting
    on the agent's own store hung at their rendezvous in this suite. The setting holds for this launch
    only; the directory goes with it."""
    before = os.environ.get(RANK_STORE_DIR)
    with tempfile.TemporaryDirectory(prefix="fsdp_lab-ranks-", ignore_cleanup_errors=True) as store_dir:
        os.environ[RANK_STORE_DIR] = store_dir
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(RANK_STORE_DIR, None)
            else:
                os.environ[RANK_STORE_DIR] = before


def check_launch(run: RunConfig, device_type: str, ranks_started_by: str | None = None) -> None:
    """NUMA binding places each rank by its GPU's place on the host, as the lab starts it: a run without
    GPUs has no such place, and ranks that another launcher starts (`ranks_started_by`; this process
    already a rank: torchrun or srun) are placed by that launcher."""
    binding = run.launch.numa_binding
    if not binding:
        return
    if device_type != "cuda":
        raise ConfigError(f"launch.numa_binding={binding}: binds each rank to the CPUs near its GPU; "
                          f"this run's device is {device_type}: leave it null")
    started_by = ranks_started_by or ("torchrun or srun" if is_rank_process() else None)
    if started_by:
        raise ConfigError(f"launch.numa_binding={binding}: applies where the lab starts the ranks; {started_by} "
                          "starts these: bind there (torchrun --numa-binding, srun --cpu-bind)")


def launch_config(*, n: int, run_dir: Path, max_restarts: int, start_method: str,
                  numa_binding: str | None = None) -> LaunchConfig:
    """torch elastic's settings for `n` local ranks, their output under `run_dir`/logs."""
    # One node has nothing to rendezvous with: the static rendezvous is elastic's own store on a port
    # it binds (":0"). The dynamic one (c10d) waits a random 0-0.3 s before its first round, to spread
    # many nodes' joins (0.11-0.21 s measured, a quarter of a small CPU run). Restarts go through it alike.
    return LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=n, run_id=run_dir.name,
        rdzv_backend="static", rdzv_endpoint="localhost:0", rdzv_configs={"rank": 0}, max_restarts=max_restarts,
        monitor_interval=0.1, start_method=start_method, log_line_prefix_template="[rank${rank}]:",
        numa_options=NumaOptions(affinity_mode=AffinityMode(numa_binding)) if numa_binding else None,
        # Every rank's output is kept under logs/; rank 0's stdout and all stderr also reach the console.
        logs_specs=DefaultLogsSpecs(
            log_dir=str(run_dir / "logs"), tee={i: Std.ALL if i == 0 else Std.ERR for i in range(n)}
        ),
    )


def launch(entry, args: tuple, *, n: int, run_dir: Path, max_restarts: int, start_method: str,
           numa_binding: str | None = None) -> None:
    """`entry(*args)` on `n` local ranks through torch elastic, their output under `run_dir`/logs."""
    # One thread per rank share of the cores; also silences elastic's warning about the default.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    config = launch_config(n=n, run_dir=run_dir, max_restarts=max_restarts, start_method=start_method,
                           numa_binding=numa_binding)
    if start_method == "fork":
        entry = _with_launch_threads(entry)
    try:
        with _rank_store_dir():
            elastic_launch(config, entry)(*args)
    except ChildFailedError as e:
        raise RankFailed(describe_failure(e)) from None
    except SignalException as e:  # elastic has already stopped every rank with that signal
        raise Interrupted(f"interrupted by {e.sigval.name}; every rank was stopped") from None
