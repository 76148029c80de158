"""Bring your own model: a module defined in tests/own_models.py (model=custom) and Hugging Face
families (model=hf) train on every engine and mesh with parity (a 2-rank matrix,
tests/own_models_matrix.py); each rank materialises only its shards, the slices of the whole model
that the parity reference and every other mesh start from; the estimate runs on them."""

from __future__ import annotations

import json

import pytest
import torch

from fsdp_lab.estimate import estimate
from fsdp_lab.models import build_meta, build_model, count_params
from matrix_rank import launch, result_of
from worlds import sharded_on_two_fake_ranks
from own_models_matrix import FAMILIES, MESHES, TINY_HF, variants

CUSTOM = FAMILIES["custom"]
LLAMA = FAMILIES["llama"]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> dict:
    return launch("own_models_matrix", tmp_path_factory.mktemp("own_models"))


@pytest.mark.slow
def test_every_family_trains_on_every_engine_and_mesh_with_parity(matrix):
    assert set(matrix) == set(variants())
    for label in sorted(matrix):
        parity = result_of(matrix, label)["parity"]
        assert parity["ok"] and parity["max_param_abs_diff"] is not None, (label, parity)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_engine_and_mesh_starts_from_the_same_weights(matrix, family):
    # Same weights and data on every data-parallel layout: the same losses, step after step.
    losses = {mesh: result_of(matrix, f"{family}/{mesh}")["losses"] for mesh in MESHES}
    for mesh, values in losses.items():
        assert values == pytest.approx(losses["ddp"], rel=1e-6, abs=0), (family, mesh, losses)


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("model", ["transformer_tied", "llama"])
def test_a_rank_materialises_its_slice_of_the_whole_model(fake_group, compose_run, rank, model):
    run = compose_run(*(LLAMA if model == "llama" else ["model.tie_embeddings=true", "model.dim=32"]))
    fake_group(2, rank)
    sharded = sharded_on_two_fake_ranks(run.model, rank, seed=3)
    whole = build_model(run.model, seed=3)
    names = [n for n, _ in whole.named_parameters()]
    assert [n for n, _ in sharded.named_parameters()] == names
    for (name, p), w in zip(sharded.named_parameters(), whole.parameters()):
        assert torch.equal(p.to_local(), w.detach().chunk(2)[rank]), name
    if model == "transformer_tied":
        assert sharded.output.weight is sharded.tok_embeddings.weight


def test_the_seed_alone_decides_the_weights(compose_run):
    run = compose_run(*CUSTOM)
    first, again, other = (dict(build_model(run.model, seed).named_parameters()) for seed in (0, 0, 1))
    assert all(torch.equal(first[n], again[n]) for n in first)
    assert not any(torch.equal(first[n], other[n]) for n in first if "weight" in n and first[n].std() > 0)


def test_a_checkpoint_dirs_config_json_builds_the_model_its_type_builds(compose_run, tmp_path):
    from transformers import AutoConfig

    overrides = {o.split("=")[0].removeprefix("model.config."): int(o.split("=")[1]) for o in TINY_HF}
    AutoConfig.for_model("qwen2", **overrides).save_pretrained(tmp_path)
    from_dir = compose_run("model=hf", "model.model_type=null", f"model.config_path={tmp_path}")
    from_type = compose_run(*FAMILIES["qwen2"])
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen2"
    shapes = [{n: p.shape for n, p in build_meta(r.model).named_parameters()} for r in (from_dir, from_type)]
    assert shapes[0] == shapes[1]


@pytest.mark.parametrize("family", ["custom", "llama"])
def test_the_estimate_runs_on_a_users_model(prepared, family):
    run, dims = prepared(*FAMILIES[family], "mode=estimate", "mesh.dp_shard=4")
    result = estimate(run, dims)
    assert result["model"] == {"name": run.model.name, "params": count_params(build_meta(run.model))}
    # 4 shards of fp32 parameters, their gradients and AdamW's two states, at least.
    assert result["peak_mib"] * 2**20 >= 4 * 4 * result["model"]["params"] / 4
