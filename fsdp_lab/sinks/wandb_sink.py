"""W&B from rank 0: the resolved config (secrets masked), the same metric keys as metrics.jsonl
plotted against `step`, summaries with the reduction each metric needs, the final summary, and
tables for the parity verdict and the memory per phase.
W&B never breaks a run: if it cannot start or log, the run warns once and goes on."""

from __future__ import annotations

import logging
import netrc
import os
from functools import partial
from pathlib import Path

from fsdp_lab.config import LoggerConfig
from fsdp_lab.memory_phases import PHASES
from fsdp_lab.sinks.secrets import scrub, secret_values

log = logging.getLogger(__name__)

# How each metric's W&B summary reduces its history (W&B stores it as e.g. `memory/peak_mib.max`).
# Memory and parity drift: the worst step; loss: where training ended; throughput: the typical step.
# Named one by one: when several glob patterns match a key, W&B applies any one of them.
SUMMARY_REDUCTIONS = {
    "loss": "last,min",
    **{f"memory/{phase}_mib": "max" for phase in (*PHASES, "peak")},
    "parity/loss_abs_diff": "min,max",
    "parity/param_max_abs_diff": "min,max",
    "perf/step_time_s": "mean",
    "perf/tokens_per_s": "mean",
    "perf/mfu": "mean",
}
PARITY_TABLE = "tables/parity_verdict"
MEMORY_TABLE = "tables/memory_phases"


def wandb_mode(cfg: LoggerConfig) -> str:
    """The configured mode, or online when a W&B login exists, else offline."""
    if cfg.mode:
        return cfg.mode
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        return "online" if netrc.netrc().authenticators("api.wandb.ai") else "offline"
    except (FileNotFoundError, netrc.NetrcParseError):
        return "offline"


def mesh_job_type(engine: str, mesh: dict[str, int]) -> str:
    """`fsdp2-dp_replicate2xdp_shard4`: the engine and the mesh's dims of degree > 1."""
    return f"{engine}-" + ("x".join(f"{k}{v}" for k, v in mesh.items() if v > 1) or "1rank")


def define_metrics(run) -> None:
    """Every metric is plotted against `step`; the public ones get their SUMMARY_REDUCTIONS (a name
    defined exactly takes precedence over the catch-all `*`)."""
    run.define_metric("step")
    for key, reduction in SUMMARY_REDUCTIONS.items():
        run.define_metric(key, step_metric="step", summary=reduction)
    run.define_metric("*", step_metric="step")


def summary_tables(summary: dict) -> dict[str, tuple[list[str], list[list]]]:
    """The parity verdict and the memory of the last step's phases as (columns, rows)."""
    tables = {}
    parity = summary.get("parity") or {}
    if parity.get("enabled"):
        columns = ["reference", "tolerance", "max_loss_abs_diff", "max_param_abs_diff", "ok"]
        tables[PARITY_TABLE] = (columns, [[parity[c] for c in columns]])
    memory = summary.get("memory") or {}
    if memory.get("phases_mib"):
        rows = [[p, memory["phases_mib"][p]] for p in PHASES if p in memory["phases_mib"]]
        tables[MEMORY_TABLE] = (["phase", "mib"], rows + [["peak", memory["peak_mib"]]])
    return tables


class WandbSink:
    def __init__(self, cfg: LoggerConfig, *, run_dir: Path, name: str, config: dict, job_type: str):
        self.run = None
        self.secrets = secret_values()
        try:
            import wandb

            hide = partial(scrub, secrets=self.secrets)
            self.run = wandb.init(
                project=cfg.project, entity=cfg.entity, group=hide(cfg.group), job_type=job_type, name=hide(name),
                tags=hide(list(cfg.tags)), config=hide(config), dir=str(run_dir), mode=wandb_mode(cfg),
                reinit="finish_previous",
                settings=wandb.Settings(console="off", silent=True, init_timeout=cfg.init_timeout_s),
            )
            define_metrics(self.run)
        except Exception as e:  # noqa: BLE001 - any W&B failure must leave the run going
            self._disable(f"could not start ({type(e).__name__}: {e})")

    def _disable(self, why: str) -> None:
        # No finish() here: on a broken connection it could block; the next wandb.init
        # (reinit="finish_previous") or the process's exit closes the run.
        log.warning("W&B disabled for this run: %s; metrics.jsonl still has everything", why)
        self.run = None

    def log(self, row: dict) -> None:
        if self.run is None:
            return
        try:
            self.run.log({k: v for k, v in row.items() if v is not None})
        except Exception as e:  # noqa: BLE001
            self._disable(f"log failed ({type(e).__name__}: {e})")

    def log_table(self, key: str, columns: list[str], rows: list[list]) -> None:
        """A table of the whole run (e.g. a per-module memory breakdown) under `key` in its summary,
        so the history keeps one row per step, as metrics.jsonl does."""
        if self.run is None:
            return
        try:
            import wandb

            self.run.summary[key] = wandb.Table(columns=columns, data=rows)
        except Exception as e:  # noqa: BLE001
            self._disable(f"table {key} failed ({type(e).__name__}: {e})")

    def finish(self, summary: dict, exit_code: int) -> None:
        for key, (columns, rows) in summary_tables(summary).items():
            self.log_table(key, columns, rows)
        if self.run is None:
            return
        try:
            self.run.summary.update(scrub(summary, self.secrets))
            self.run.finish(exit_code=exit_code)
        except Exception as e:  # noqa: BLE001
            self._disable(f"finish failed ({type(e).__name__}: {e})")
