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

from lab import REPO, LabRun, lab_env, lab_run

PRELOAD = ["fsdp_lab.run", "fsdp_lab.spawn", "fsdp_lab.worker", "hydra_plugins.fsdp_lab_launchers._core"]
_server = multiprocessing.get_context("forkserver")
_server.set_forkserver_preload(PRELOAD)


def _as_the_cli(args: list[str], env: dict[str, str], out_path: str, err_path: str) -> None:
    """In the forked process: become `python -m fsdp_lab ARGS` started in the repo with `env`."""
    os.chdir(REPO)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out_path), (2, err_path)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)  # PYTHONUNBUFFERED's effect on a fresh interpreter
    sys.argv = ["fsdp_lab", *args]
    try:
        runpy.run_module("fsdp_lab", run_name="__main__", alter_sys=True)  # SystemExit is the exit code
    finally:
        atexit._run_exitfuncs()  # what an interpreter's exit runs (W&B writes out its run files); a fork skips it


def run_lab_warm(*overrides: str, run_dir: Path | None = None, timeout: float = 300, env: dict[str, str] | None = None) -> LabRun:
    """As tests/lab.run_lab(*overrides, run_dir=..., timeout=..., env=...)."""
    args = list(overrides) + ([f"hydra.run.dir={run_dir}"] if run_dir is not None else [])
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        process = _server.Process(target=_as_the_cli, args=(args, env or lab_env(), str(out), str(err)), name="fsdp_lab")
        process.start()
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(["fsdp_lab", *args], timeout, out.read_text(), err.read_text())
        return lab_run(process.exitcode, out.read_text(), err.read_text())
