"""plan.validate=K: the best K candidates run here, each as a one-job sweep through the lab's own
multirun launcher (hydra/launcher=torchrun), plan.validate_repeats times, alternating (every candidate
once per round, so a machine's drift falls on all alike); their median step time and largest peak go
beside the predictions in plan.json. The memory probe runs whatever the experiment sets: a measured
peak is what checks a "fits"."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from fsdp_lab.plan.search import Candidate

VALIDATE_DIR = "validate"
# A short run timed like the benchmarks: the parity reference and W&B off, the first steps left out,
# step time and per-phase memory on (no per-module tracker: it slows the step it tracks).
RUN_OVERRIDES = ["train.steps=8", "probes.perf.warmup_steps=3", "probes.parity.enabled=false", "logger=none",
                 "probes.perf.enabled=true", "probes.memory.enabled=true", "probes.memory.tracker=none"]


def _launcher_env() -> dict[str, str]:
    """The environment of a fresh lab process: the launcher plugins on the path, no rank variables."""
    launchers = str(Path(__file__).resolve().parents[2] / "launchers")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([launchers, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    return env


def run_once(overrides: list[str], sweep_dir: Path) -> dict:
    """One run of the lab with `overrides`: {step_time_s, peak_mib, run_dir} or {error}."""
    cmd = [sys.executable, "-m", "fsdp_lab", "-m", *overrides, *RUN_OVERRIDES, f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_launcher_env())
    summary = sweep_dir / "sweep_summary.json"
    job = json.loads(summary.read_text())["jobs"][0] if summary.exists() else None
    if job is None or job["status"] != "ok":
        return {"error": (job or {}).get("error") or (proc.stderr.strip().splitlines() or ["no sweep summary"])[-1]}
    return {"step_time_s": job["step_time_s"], "peak_mib": job.get("peak_mib"), "run_dir": job["run_dir"]}


def summarise(candidate: Candidate, runs: list[dict]) -> dict:
    """A candidate's runs as one measurement: the median step time of those that finished, the largest
    peak measured (None where no run measured one), and how many failed (a failed "fits" is news)."""
    ok = [r for r in runs if "error" not in r]
    failed = [r["error"] for r in runs if "error" in r]
    if not ok:
        return {"error": failed[0], "runs": len(runs), "failed_runs": len(failed)}
    step = statistics.median(r["step_time_s"] for r in ok)
    peaks = [r["peak_mib"] for r in ok if r.get("peak_mib") is not None]
    out = {"step_time_s": step, "step_times_s": [r["step_time_s"] for r in ok], "peak_mib": max(peaks) if peaks else None,
           "step_time_error": candidate.prediction["step_time_s"] / step - 1, "runs": len(runs), "failed_runs": len(failed),
           "run_dirs": [r["run_dir"] for r in ok]}
    if failed:
        out["error"] = failed[0]
    return out


def validate(candidates: list[Candidate], rows: list[dict], user_overrides: list[str], run_dir: Path,
             repeats: int, written: Callable[[], None] = lambda: None) -> dict[int, dict]:
    """Run each candidate `repeats` times, alternating; fills rows[i]['measured'] and returns {i: measured}.
    `written` is called after every run with the rows as measured so far: a validation cut off (a time
    limit, a killed job) keeps in plan.json what it measured."""
    from fsdp_lab.plan.run import OWN_KEYS

    kept = [o for o in user_overrides if not OWN_KEYS.match(o)]
    runs: dict[int, list[dict]] = {i: [] for i in range(len(candidates))}
    for r in range(repeats):
        for i, candidate in enumerate(candidates):
            result = run_once([*kept, *rows[i]["overrides"]], run_dir / VALIDATE_DIR / str(i + 1) / f"run{r + 1}")
            runs[i].append(result)
            rows[i]["measured"] = summarise(candidate, runs[i])
            written()
            print(f"validated {i + 1}/{len(candidates)}, run {r + 1}/{repeats}: {json.dumps(result)}", flush=True)
    return {i: rows[i]["measured"] for i in range(len(candidates))}
