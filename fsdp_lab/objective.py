"""`sweep.objective`: the figure a finished run hands back to a Hydra sweeper as its task function's
return value (Optuna optimises it), read from the run's summary.json. Named as the metric keys are
(`perf/tokens_per_s`); `section/key` is summary.json's `section.key`."""

from __future__ import annotations

from pathlib import Path

from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.sinks.files import read_summary

# The probe that fills each section: an objective from a probe that is off could never be read.
OBJECTIVES = {
    "final_loss": None,
    "perf/tokens_per_s": "perf",
    "perf/step_time_s": "perf",
    "perf/iteration_time_s": "perf",
    "perf/mfu": "perf",
    "memory/peak_mib": "memory",
    "memory/reserved_peak_mib": "memory",
    "parity/max_loss_abs_diff": "parity",
    "parity/max_param_abs_diff": "parity",
}


class ObjectiveMissing(RuntimeError):
    """The run finished but its summary.json has no number for the objective (perf/mfu on a CPU)."""


def check_objective(run: RunConfig) -> None:
    """Refuse, before any rank starts, an objective the run cannot produce."""
    key = run.sweep.objective
    if key is None:
        return
    if key not in OBJECTIVES:
        raise ConfigError(f"sweep.objective={key}: one of {', '.join(OBJECTIVES)}")
    if run.mode != "train":
        raise ConfigError(f"sweep.objective={key}: only a training run returns a figure, not mode={run.mode}")
    probe = OBJECTIVES[key]
    if probe is not None and not getattr(run.probes, probe).enabled:
        raise ConfigError(f"sweep.objective={key}: needs probes.{probe}.enabled=true")


def objective_value(run: RunConfig, run_dir: Path) -> float | None:
    """The finished run's objective (None when the run asks for none); raises ObjectiveMissing."""
    key = run.sweep.objective
    if key is None:
        return None
    value = read_summary(run_dir) or {}
    for part in key.split("/"):
        value = value.get(part) if isinstance(value, dict) else None
    if not isinstance(value, (int, float)):
        raise ObjectiveMissing(f"sweep.objective={key}: summary.json in {run_dir} has no number for it (got {value!r})")
    return float(value)
