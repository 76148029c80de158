"""The checkpoint-wrapper and fine-tuning matrices: their variants, and one rank of them
(tests/matrix_rank.py). Every variant is a torch_* experiment plus the
overrides of one point of its sweep, composed by Hydra, built by the lab's own `build_trainer` and
trained 2 steps; its checks are evaluated as a run's rank 0 does. Starting the ranks once for all
variants keeps the dozens of them cheap. Rank 0 writes {label: {checks, losses, after_fwd_mib,
frozen, nesting, manual}} as JSON."""

from __future__ import annotations

import sys

from torch import nn

from fsdp_lab.checks import evaluate
from fsdp_lab.modules import unwrap
from fsdp_lab.summary import probe_sections
from matrix_rank import run_matrix
from training import train

COMMON = ["train.steps=2", "probes.parity.param_every=1", "probes.perf.enabled=false", "logger=none", "device=cpu"]
# test_fsdp_checkpoint's variants: FSDP(checkpoint(layer)), checkpoint(FSDP(layer)), manual calls.
CHECKPOINT_EXPERIMENTS = {
    "wrapper": "torch_fsdp_checkpoint", "outer_wrapper": "torch_fsdp_checkpoint_outer", "manual": "torch_fsdp_checkpoint_manual",
}
# The points each engine sweeps on CPU besides activation offload: FSDP1's CPU offload needs a GPU, so
# FSDP2 gives the CPU-offloaded point (FSDP1 the points without).
ENGINE_POINTS = {"fsdp1": ("fsdp.use_orig_params=false", "fsdp.use_orig_params=true"), "fsdp2": ("fsdp.cpu_offload=true",)}
FINE_TUNE_EXPERIMENTS = ("torch_fine_tune", "torch_fine_tune_unused_input", "torch_fine_tune_multi_traversal")
STRATEGIES = ("full_shard", "shard_grad_op", "no_shard")
TINY_TRANSFORMER = [
    "model=transformer", "model.dim=16", "model.n_heads=2", "model.ffn_dim=32", "model.vocab_size=32", "train.seq_len=8",
    "checks=[parity_ok]",
]


def checkpoint_variants() -> dict[str, list[str]]:
    out = {}
    for engine, points in ENGINE_POINTS.items():
        for point in points:
            overrides = [f"mesh.engine={engine}", point]
            out[f"{engine}/{point}/none"] = ["+experiment=torch_fsdp_checkpoint", "ac.mode=none", *overrides]
            for impl, experiment in CHECKPOINT_EXPERIMENTS.items():
                for mode in ("full", "offload"):
                    out[f"{engine}/{point}/{impl}/{mode}"] = [f"+experiment={experiment}", f"ac.mode={mode}", *overrides]
    return out


def fine_tune_variants() -> dict[str, list[str]]:
    out = {}
    for experiment in FINE_TUNE_EXPERIMENTS:
        for strategy in STRATEGIES:
            for orig in ("false", "true"):
                out[f"{experiment}/{strategy}/use_orig_params={orig}"] = [
                    f"+experiment={experiment}", f"fsdp.sharding_strategy={strategy}", f"fsdp.use_orig_params={orig}",
                ]
        out[f"{experiment}/fsdp2"] = [f"+experiment={experiment}", "mesh.engine=fsdp2", "fsdp.sharding_strategy=auto"]
    # The other axes the experiments' comments sweep (the PyTorch tests' own).
    out["torch_fine_tune_unused_input/backward_post"] = ["+experiment=torch_fine_tune_unused_input", "fsdp.backward_prefetch_policy=backward_post"]
    out["torch_fine_tune_multi_traversal/forward_prefetch"] = ["+experiment=torch_fine_tune_multi_traversal", "fsdp.forward_prefetch=1"]
    return out


def composition_variants() -> dict[str, list[str]]:
    """outer_wrapper and manual with what else AC composes with: the reentrant variant and op-level
    selective checkpointing (on a transformer: mlp_stack's raw inputs rule out reentrant), DDP."""
    out = {}
    for engine in ("fsdp1", "fsdp2"):
        for impl in ("outer_wrapper", "manual"):
            out[f"transformer/{engine}/{impl}/reentrant"] = [*TINY_TRANSFORMER, f"mesh.engine={engine}", "ac=full", f"ac.impl={impl}", "ac.reentrant=true"]
            out[f"transformer/{engine}/{impl}/selective_op"] = [
                *TINY_TRANSFORMER, f"mesh.engine={engine}", "ac=selective", "ac.selective=op", "ac.every=1", f"ac.impl={impl}",
            ]
    out["transformer/ddp/manual/full"] = [*TINY_TRANSFORMER, "mesh.engine=ddp", "ac=full", "ac.impl=manual"]
    return out


def nesting(module: nn.Module) -> list[str]:
    """Class names from a block inwards through checkpoint and FSDP1 wrappers: what wraps what."""
    names = [type(module).__name__]
    # _modules, not getattr: FSDP1 forwards unknown attributes to the module it wraps.
    while (inner := module._modules.get("_fsdp_wrapped_module") or module._modules.get("_checkpoint_wrapped_module")) is not None:
        module = inner
        names.append(type(module).__name__)
    return names


def train_variant(overrides: list[str], ctx) -> dict:
    run, trainer, rows = train(COMMON + overrides, ctx)
    summary = probe_sections(trainer.probes)
    model = unwrap(trainer.model)
    return {
        "checks": evaluate(run.checks, summary, rows),
        "losses": [r["loss"] for r in rows],
        "after_fwd_mib": max((r["memory/after_fwd_mib"] for r in rows if "memory/after_fwd_mib" in r), default=None),
        "frozen": summary.get("frozen"),
        "nesting": nesting(model.blocks[0]),
        "manual": {str(i): getattr(r, "func", r).__name__ for i, r in model.__dict__.get("block_calls", {}).items()},
    }


def all_variants() -> dict[str, list[str]]:
    return {**checkpoint_variants(), **composition_variants(), **fine_tune_variants()}


def main(out_path: str) -> None:
    run_matrix(all_variants(), train_variant, out_path)


if __name__ == "__main__":  # torchrun --nproc-per-node 2 tests/ckpt_finetune_matrix.py OUT.json
    main(sys.argv[1])
