"""One rank of the activation-checkpointing matrix (started by torchrun from tests/test_ac.py).

Every variant is composed from conf/ by Hydra, built by the lab's own `build_trainer` (parallelize
with AC, the DDP parity reference, the memory probe) and trained a few steps; starting ranks once
for all variants keeps the matrix fast. Rank 0 writes {label: {parity, after_fwd_mib}} as JSON."""

from __future__ import annotations

import json
import sys

from hydra import compose, initialize_config_dir

from fsdp_lab.config import to_run_config
from fsdp_lab.dist import init_distributed
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.run import CONF_DIR  # registers the schema and resolvers
from fsdp_lab.worker import build_trainer

# A transformer whose activations dwarf its parameters: long sequences, a narrow model.
ACTIVATION_HEAVY = [
    "model.dim=32", "model.n_heads=2", "model.ffn_dim=64", "model.n_layers=4", "model.vocab_size=64",
    "train.seq_len=128", "train.batch_size=4", "train.steps=2", "probes.parity.param_every=1",
    "probes.perf.enabled=false", "logger=none", "device=cpu",
]

MODES = {
    "full": ["ac=full"],
    "selective_layer": ["ac=selective", "ac.selective=layer", "ac.every=2"],
    "selective_op": ["ac=selective", "ac.selective=op", "ac.every=1"],
    "offload": ["ac=offload"],
}
IMPLS = ("composable", "utils", "wrapper")


def variants() -> dict[str, list[str]]:
    out = {"none": ["ac=none"]}
    for mode, overrides in MODES.items():
        for impl in IMPLS:
            out[f"{mode}/{impl}"] = overrides + [f"ac.impl={impl}"]
    for impl in ("utils", "wrapper"):
        out[f"full/{impl}/reentrant"] = ["ac=full", f"ac.impl={impl}", "ac.reentrant=true"]
    for tag, engine_overrides in (("ddp", ["mesh.engine=ddp"]), ("cpu_offload", ["fsdp.cpu_offload=true"])):
        out[f"full/composable/{tag}"] = ["ac=full", "ac.impl=composable"] + engine_overrides
        out[f"selective_op/utils/{tag}"] = MODES["selective_op"] + ["ac.impl=utils"] + engine_overrides
        out[f"full/wrapper/reentrant/{tag}"] = ["ac=full", "ac.impl=wrapper", "ac.reentrant=true"] + engine_overrides
        out[f"offload/utils/{tag}"] = ["ac=offload", "ac.impl=utils"] + engine_overrides
    return out


def train_variant(overrides: list[str], ctx) -> dict:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        run = to_run_config(compose(config_name="config", overrides=ACTIVATION_HEAVY + overrides))
    dims = ParallelDims.resolve(pp=1, dp_replicate=1, dp_shard=-1, tp=1, world_size=ctx.world_size)
    rows: list[dict] = []
    trainer = build_trainer(run, dims, ctx, on_step=rows.append)
    trainer.run()
    return {
        "parity": trainer.reference.verdict.as_summary(),
        "losses": [r["loss"] for r in rows],
        "after_fwd_mib": max(r["memory/after_fwd_mib"] for r in rows),
    }


def main(out_path: str) -> None:
    ctx = init_distributed("cpu", timeout_s=120)
    results = {label: train_variant(overrides, ctx) for label, overrides in variants().items()}
    if ctx.is_main:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
