"""The bring-your-own-model matrix: a model defined in tests/own_models.py (model=custom) and three
Hugging Face families (model=hf: llama, qwen2, gemma with tied embeddings) on every data-parallel
engine and mesh, with activation checkpointing, plus Llama under tensor parallelism; one rank of it
(tests/matrix_rank.py). Rank 0 writes {label: {parity, losses}} as JSON."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # own_models, as a user's package on the path

from matrix_rank import run_matrix  # noqa: E402
from training import train  # noqa: E402

TINY_HF = [
    "model.config.hidden_size=32", "model.config.intermediate_size=64", "model.config.num_hidden_layers=2",
    "model.config.num_attention_heads=4", "model.config.num_key_value_heads=2", "model.config.vocab_size=64",
]
FAMILIES = {
    "custom": ["model=custom", "model.build._target_=own_models.TinyGPT", "+model.build.vocab=64", "+model.build.dim=32",
               "+model.build.n_layer=2", "model.blocks=blocks", "model.vocab_size=64"],
    "llama": ["model=hf", "model.model_type=llama", *TINY_HF],
    "qwen2": ["model=hf", "model.model_type=qwen2", *TINY_HF],
    "gemma": ["model=hf", "model.model_type=gemma", *TINY_HF, "model.config.head_dim=8"],  # ties its embeddings
}
MESHES = {
    "fsdp": ["mesh=fsdp", "ac=full"],
    "hsdp": ["mesh=hsdp", "ac=full", "ac.impl=wrapper"],
    "ddp": ["mesh=ddp", "ac=full", "ac.impl=utils"],
    "fsdp1": ["mesh=fsdp", "mesh.engine=fsdp1", "ac=full"],
}
COMMON = ["train.steps=2", "train.seq_len=8", "train.batch_size=2", "probes.parity.param_every=1", "probes.perf.enabled=false",
          "logger=none", "device=cpu", "optim=sgd"]


def variants() -> dict[str, list[str]]:
    out = {f"{family}/{mesh}": model + overrides for family, model in FAMILIES.items() for mesh, overrides in MESHES.items()}
    out["llama/tp"] = FAMILIES["llama"] + ["mesh=tp2d"]
    out["classifier/fsdp"] = [
        "model=custom", "model.build._target_=own_models.classifier", "+model.build.features=12", "+model.build.hidden=16",
        "+model.build.classes=5", "model.blocks=1", "model.inputs=features", "model.features=[12]", "model.classes=5", "ac=full",
    ]
    return out


def train_variant(overrides: list[str], ctx) -> dict:
    _, trainer, rows = train(COMMON + overrides, ctx)
    return {"parity": trainer.reference.verdict.as_summary(), "losses": [r["loss"] for r in rows]}


def main(out_path: str) -> None:
    run_matrix(variants(), train_variant, out_path)


if __name__ == "__main__":  # torchrun --nproc-per-node 2 tests/own_models_matrix.py OUT.json
    main(sys.argv[1])
