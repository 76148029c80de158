"""W&B from rank 0: the resolved config, the same metric keys as metrics.jsonl, the summary.
W&B never breaks a run: if it cannot start or log, the run warns once and goes on."""

from __future__ import annotations

import logging
import netrc
import os
from pathlib import Path

from fsdp_lab.config import LoggerConfig

log = logging.getLogger(__name__)


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


class WandbSink:
    def __init__(self, cfg: LoggerConfig, *, run_dir: Path, name: str, config: dict, group: str | None, job_type: str):
        self.run = None
        try:
            import wandb

            self.run = wandb.init(
                project=cfg.project, entity=cfg.entity, group=cfg.group or group, job_type=job_type,
                name=name, tags=list(cfg.tags), config=config, dir=str(run_dir), mode=wandb_mode(cfg),
                reinit="finish_previous",
                settings=wandb.Settings(console="off", silent=True),
            )
            self.run.define_metric("*", step_metric="step")
        except Exception as e:  # noqa: BLE001 - any W&B failure must leave the run going
            self._disable(f"could not start ({type(e).__name__}: {e})")

    def _disable(self, why: str) -> None:
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
        if self.run is None:
            return
        try:
            import wandb

            self.run.log({key: wandb.Table(columns=columns, data=rows)})
        except Exception as e:  # noqa: BLE001
            self._disable(f"log_table failed ({type(e).__name__}: {e})")

    def finish(self, summary: dict, exit_code: int) -> None:
        if self.run is None:
            return
        try:
            self.run.summary.update(summary)
            self.run.finish(exit_code=exit_code)
        except Exception as e:  # noqa: BLE001
            self._disable(f"finish failed ({type(e).__name__}: {e})")
