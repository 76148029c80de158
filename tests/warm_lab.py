"""`python -m fsdp_lab ...` in a process forked from a warm server, for slow tests that look at what a
run computed and wrote rather than at the process itself: the same entry point, ranks, run dir and
output as tests/lab.run_lab, without paying a fresh interpreter's imports (torch, Hydra, the lab:
seconds of every launch) each time.

The server is multiprocessing's forkserver: started once per test session, single-threaded, it has
imported the lab and nothing else, and forks each run's process. Tests about the process itself (its
command line, signals sent to it, a fresh interpreter's exit) use tests/lab.run_lab. A run past its time
limit (a hang) fails with the Python stacks of every thread of its launcher and ranks, and is killed with
its ranks."""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import multiprocessing
import os
import runpy
import signal
import sys
import tempfile
import time
from pathlib import Path

from fsdp_lab.cli_process import REPO, LabRun, lab_env, lab_run

PRELOAD = ["fsdp_lab.run", "fsdp_lab.spawn", "fsdp_lab.worker", "hydra_plugins.fsdp_lab_launchers._core"]
_server = multiprocessing.get_context("forkserver")
_server.set_forkserver_preload(PRELOAD)


def _in_the_repo(target, args: tuple, env: dict[str, str], out_path: str, err_path: str) -> None:
    """In the forked process: started in the repo with `env`, output to files, as a fresh process."""
    os.chdir(REPO)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out_path), (2, err_path)):
        os.dup2(os.open(path, os.O_WRONLY), fd)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)  # PYTHONUNBUFFERED's effect on a fresh interpreter
    # Its stacks on STACKS_SIGNAL, and its forked ranks' (inherited; elastic tees a rank's stderr to this one's).
    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)
    try:
        target(*args)  # SystemExit is the exit code
    finally:
        atexit._run_exitfuncs()  # what an interpreter's exit runs (W&B writes out its run files); a fork skips it


def in_a_warm_process(target, args: tuple, *, timeout: float, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`target(*args)` (a module-level function) in a process forked from the warm server, started in
    the repo with `env` (default: tests/lab.lab_env()); returns its exit code, stdout and stderr."""
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        out.touch(), err.touch()  # read back even if the process dies before it redirects its output
        process = _server.Process(target=_in_the_repo, args=(target, args, env or lab_env(), str(out), str(err)), name=target.__name__)
        process.start()
        process.join(timeout)
        if process.is_alive():
            _stacks_then_kill(process.pid)
            process.join()
            raise AssertionError(f"{target.__name__}{args} ran past {timeout:.0f} s and was killed; every process's stacks "
                                 f"are in its stderr.\nstdout's end:\n{out.read_text()[-3000:]}\nstderr's end:\n{err.read_text()[-20000:]}")
        return process.exitcode, out.read_text(), err.read_text()


STACKS_SIGNAL = signal.SIGUSR1
# Elastic's tee reads a rank's log every 0.1 s.
TEE_DELAY_S = 1.0


def _descendants(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # the thread or process ended meanwhile
            continue
    return [d for child in children for d in (child, *_descendants(child))]


def _stacks_then_kill(pid: int) -> None:
    """A run past its limit (a hang): every process of it writes its threads' stacks to stderr, then all are killed."""
    tree = [pid, *_descendants(pid)]
    for each in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, STACKS_SIGNAL)
    time.sleep(TEE_DELAY_S)
    for each in reversed(tree):
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


def _as_the_cli(args: list[str]) -> None:
    sys.argv = ["fsdp_lab", *args]
    runpy.run_module("fsdp_lab", run_name="__main__", alter_sys=True)


def run_lab_warm(*overrides: str, run_dir: Path | None = None, timeout: float = 300, env: dict[str, str] | None = None) -> LabRun:
    """As tests/lab.run_lab(*overrides, run_dir=..., timeout=..., env=...)."""
    args = list(overrides) + ([f"hydra.run.dir={run_dir}"] if run_dir is not None else [])
    return lab_run(*in_a_warm_process(_as_the_cli, (args,), timeout=timeout, env=env))
