"""The lab's command lines worked in this process, for the fast tier: `python -m fsdp_lab ...` as
rank 0 of a world of one (what torchrun with one rank sets up, so the process works as that rank and
spawns none), and `python -m fsdp_lab.report PATH`. What they print, their exit code and the run dir
come back as from a real process (tests/lab.LabRun)."""

from __future__ import annotations

import io
import os
import re
import runpy
import signal
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

from lab import LabRun
from worlds import free_port


def _run_main(module: str, argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}  # a rank installs its own
    code = 0
    try:
        with mock.patch.dict(os.environ, env), mock.patch.object(sys, "argv", argv), redirect_stdout(out), redirect_stderr(err):
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return code, out.getvalue(), err.getvalue()


def run_lab_here(*overrides: str, run_dir: Path | None = None, env: dict[str, str] | None = None) -> LabRun:
    """`python -m fsdp_lab OVERRIDES` as rank 0 of 1, in this process."""
    args = list(overrides) + ([f"hydra.run.dir={run_dir}"] if run_dir is not None else [])
    rank = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            "WANDB_SILENT": "true", **(env or {})}
    code, out, err = _run_main("fsdp_lab", ["fsdp_lab", *args], rank)
    found = re.findall(r"^run dir: (.+)$", out, flags=re.M)
    return LabRun(code, out, err, Path(found[-1]) if found else None)


def report_here(path: Path) -> LabRun:
    """`python -m fsdp_lab.report PATH`, in this process."""
    code, out, err = _run_main("fsdp_lab.report", ["fsdp_lab.report", str(path)], {})
    return LabRun(code, out, err, None)
