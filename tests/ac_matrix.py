"""The activation-checkpointing matrix: its variants, and one rank of it (tests/matrix_rank.py).

Every variant is composed from conf/ by Hydra, built by the lab's own `build_trainer` (parallelize
with AC, the DDP parity reference, the memory probe) and trained a few steps; starting ranks once
for all variants keeps the matrix fast. Rank 0 writes {label: {parity, after_fwd_mib}} as JSON."""

from __future__ import annotations

import sys

from matrix_rank import run_matrix
from training import train

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
    _, trainer, rows = train(ACTIVATION_HEAVY + overrides, ctx)
    return {
        "parity": trainer.reference.verdict.as_summary(),
        "losses": [r["loss"] for r in rows],
        "after_fwd_mib": max(r["memory/after_fwd_mib"] for r in rows),
    }


def main(out_path: str) -> None:
    run_matrix(variants(), train_variant, out_path)


if __name__ == "__main__":  # torchrun --nproc-per-node 2 tests/ac_matrix.py OUT.json
    main(sys.argv[1])
