"""Running the lab as a user does (`python -m fsdp_lab ...` in a child process) and reading back
what a run wrote: for the benchmarks and the tests that need a real process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Hydra finds the launcher plugins on the `hydra_plugins` namespace path: put this checkout's first, so
# a worktree's plugins win over an editable install pointing elsewhere (in a fresh clone they coincide).
LAUNCHERS = REPO / "launchers"


@dataclass
class LabRun:
    returncode: int
    stdout: str
    stderr: str
    run_dir: Path | None

    @property
    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    @property
    def metrics(self) -> list[dict]:
        return [json.loads(line) for line in (self.run_dir / "metrics.jsonl").read_text().splitlines()]

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error: ")]


def lab_run(returncode: int, stdout: str, stderr: str) -> LabRun:
    """What a finished `python -m fsdp_lab` left: its run dir is the last `run dir: ` line it printed."""
    found = re.findall(r"^run dir: (.+)$", stdout, flags=re.M)
    return LabRun(returncode, stdout, stderr, Path(found[-1]) if found else None)


def lab_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    path = [str(LAUNCHERS)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(WANDB_SILENT="true", PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(path), **extra)
    return env


def run_lab(*overrides: str, run_dir: Path | None = None, command: list[str] | None = None,
            timeout: float = 300, env: dict[str, str] | None = None) -> LabRun:
    """`python -m fsdp_lab OVERRIDES` (or `command`), with the run dir pinned to `run_dir` if given."""
    args = list(overrides)
    if run_dir is not None:
        args.append(f"hydra.run.dir={run_dir}")
    cmd = (command or [sys.executable, "-m", "fsdp_lab"]) + args
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env or lab_env())
    return lab_run(proc.returncode, proc.stdout, proc.stderr)
