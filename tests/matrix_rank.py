"""What the in-process matrices share (tests/ac_matrix.py, tests/ckpt_finetune_matrix.py): ranks
started once by torchrun train every variant, composed from conf/ by Hydra and built by the lab's own
`build_trainer`; rank 0 writes {label: result} as JSON."""

from __future__ import annotations

import json
from collections.abc import Callable

from hydra import compose, initialize_config_dir

from fsdp_lab.config import RunConfig, to_run_config
from fsdp_lab.dist import init_distributed
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.run import CONF_DIR  # registers the schema and resolvers
from fsdp_lab.train import Trainer
from fsdp_lab.worker import build_trainer


def train(overrides: list[str], ctx) -> tuple[RunConfig, Trainer, list[dict]]:
    """Compose `overrides`, build the run's trainer over every rank (dp_shard) and train it; returns
    the config, the trained trainer and its metric rows."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        run = to_run_config(compose(config_name="config", overrides=overrides))
    dims = ParallelDims.resolve(pp=1, dp_replicate=1, dp_shard=-1, tp=1, world_size=ctx.world_size)
    rows: list[dict] = []
    trainer = build_trainer(run, dims, ctx, on_step=rows.append)
    trainer.run()
    return run, trainer, rows


def run_matrix(variants: dict[str, list[str]], result: Callable[[list[str], object], dict], out_path: str) -> None:
    """`result(overrides, ctx)` for every variant, in order; rank 0 writes them to `out_path`."""
    ctx = init_distributed("cpu", timeout_s=120)
    results = {}
    for label, overrides in variants.items():
        if ctx.is_main:  # a failure's traceback follows the variant it belongs to
            print("variant", label, flush=True)
        results[label] = result(overrides, ctx)
    if ctx.is_main:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
