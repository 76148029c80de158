"""`python -m fsdp_lab ...` in a process forked from a warm server, for slow tests that look at what a
run computed and wrote rather than at the process itself: the same entry point, ranks, run dir and
output as tests/lab.run_lab, without paying a fresh interpreter's imports (torch, Hydra, the lab:
seconds of every launch) each time.

The server is multiprocessing's forkserver: started once per test session, single-threaded, it has
imported the lab and nothing else, and forks each run's process. Tests about the process itself (its
command line, signals sent to it, a fresh interpreter's exit) use tests/lab.run_lab."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
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
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(target.__name__, timeout, out.read_text(), err.read_text())
        return process.exitcode, out.read_text(), err.read_text()


def _as_the_cli(args: list[str]) -> None:
    sys.argv = ["fsdp_lab", *args]
    runpy.run_module("fsdp_lab", run_name="__main__", alter_sys=True)


def run_lab_warm(*overrides: str, run_dir: Path | None = None, timeout: float = 300, env: dict[str, str] | None = None) -> LabRun:
    """As tests/lab.run_lab(*overrides, run_dir=..., timeout=..., env=...)."""
    args = list(overrides) + ([f"hydra.run.dir={run_dir}"] if run_dir is not None else [])
    return lab_run(*in_a_warm_process(_as_the_cli, (args,), timeout=timeout, env=env))
