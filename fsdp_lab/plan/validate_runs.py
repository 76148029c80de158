"""plan.validate=K: the best K candidates run here, each as a one-job sweep through the lab's own
multirun launcher (hydra/launcher=torchrun), and their measured step time and peak memory go beside
the predictions in plan.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fsdp_lab.plan.search import Candidate

VALIDATE_DIR = "validate"
# A short run timed like the benchmarks: the parity reference and W&B off, the first steps left out.
RUN_OVERRIDES = ["train.steps=8", "probes.perf.warmup_steps=3", "probes.parity.enabled=false", "logger=none"]


def _launcher_env() -> dict[str, str]:
    """The environment of a fresh lab process: the launcher plugins on the path, no rank variables."""
    launchers = str(Path(__file__).resolve().parents[2] / "launchers")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([launchers, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    return env


def validate(candidates: list[Candidate], rows: list[dict], user_overrides: list[str], run_dir: Path) -> dict[int, dict]:
    """Run each candidate; fills rows[i]['measured'] and returns {i: measured} for the table."""
    from fsdp_lab.plan.run import OWN_KEYS

    kept = [o for o in user_overrides if not OWN_KEYS.match(o)]
    measured = {}
    for i, c in enumerate(candidates):
        sweep_dir = run_dir / VALIDATE_DIR / str(i + 1)
        cmd = [sys.executable, "-m", "fsdp_lab", "-m", *kept, *rows[i]["overrides"], *RUN_OVERRIDES, f"hydra.sweep.dir={sweep_dir}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_launcher_env())
        summary = sweep_dir / "sweep_summary.json"
        job = json.loads(summary.read_text())["jobs"][0] if summary.exists() else None
        if job is None or job["status"] != "ok":
            m = {"error": (job or {}).get("error") or (proc.stderr.strip().splitlines() or ["no sweep summary"])[-1]}
        else:
            m = {"step_time_s": job["step_time_s"], "peak_mib": job["peak_mib"], "run_dir": job["run_dir"],
                 "step_time_error": c.prediction["step_time_s"] / job["step_time_s"] - 1}
        rows[i]["measured"] = measured[i] = m
        print(f"validated {i + 1}/{len(candidates)}: {json.dumps(m)}", flush=True)
    return measured
