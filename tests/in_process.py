"""The lab's command lines worked in this process, for the fast tier: `python -m fsdp_lab ...` as
rank 0 of a world of one (what torchrun with one rank sets up, so the process works as that rank and
spawns none), and `python -m fsdp_lab.report PATH`. What they print, their exit code and the run dir
come back as from a real process (tests/lab.LabRun)."""

from __future__ import annotations

import io
import os
import runpy
import signal
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

from fsdp_lab.cli_process import LabRun, lab_run
from worlds import free_port


def _run_main(module: str, argv: list[str], env: dict[str, str], unset=()) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}  # a rank installs its own
    code = 0
    try:
        with mock.patch.dict(os.environ, env), mock.patch.object(sys, "argv", argv), redirect_stdout(out), redirect_stderr(err):
            for key in unset:
                os.environ.pop(key, None)
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
            except Exception:  # Hydra re-raises under a tracer (a debugger, coverage); a process would exit 1
                traceback.print_exc()
                code = 1
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if "wandb" in sys.modules:  # what the process's exit would do: W&B's service writes out the run files
            sys.modules["wandb"].teardown()
    return code, out.getvalue(), err.getvalue()


RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def run_lab_here(*overrides: str, run_dir: Path | None = None, as_rank: bool = True) -> LabRun:
    """`python -m fsdp_lab OVERRIDES` in this process: as rank 0 of 1, or (as_rank=False) as from a
    user's shell, for runs refused before any rank starts (one that is not would spawn ranks, which
    the fast tier refuses)."""
    args = list(overrides) + ([f"hydra.run.dir={run_dir}"] if run_dir is not None else [])
    env = {"WANDB_SILENT": "true"}
    if as_rank:
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return lab_run(*_run_main("fsdp_lab", ["fsdp_lab", *args], env, unset=() if as_rank else RANK_ENV))


def report_here(path: Path) -> LabRun:
    """`python -m fsdp_lab.report PATH`, in this process."""
    code, out, err = _run_main("fsdp_lab.report", ["fsdp_lab.report", str(path)], {})
    return LabRun(code, out, err, None)
