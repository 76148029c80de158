"""model.pretrained=DIR: a checkpoint written by transformers' own `save_pretrained` (one file, or
shards with an index) trains from its weights: the first step's loss is transformers' own model's
loss on the same batch; each rank reads only the slices its shards hold; a checkpoint that does not
fit the model is refused before any rank starts. Multi-rank meshes (fsdp, hsdp, tp2d) in the slow tier."""

from __future__ import annotations

import json

import pytest
import torch

from fsdp_lab.config import ConfigError
from fsdp_lab.cross_entropy import cross_entropy
from fsdp_lab.data import microbatches
from fsdp_lab.models import build_meta
from fsdp_lab.worker import build_trainer
from warm_lab import run_lab_warm
from worlds import sharded_on_two_fake_ranks

TINY_LLAMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=128, head_dim=8)
RUN = ["model=hf", "train.steps=1", "train.seq_len=8", "train.batch_size=2", "logger=none", "probes.perf.enabled=false"]


def saved_llama(directory, sharded: bool):
    """A tiny Llama saved by transformers: one safetensors file, or 7 shards and an index."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(11)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **TINY_LLAMA))
    model.save_pretrained(directory, **({"max_shard_size": "20KB"} if sharded else {}))
    assert (directory / "model.safetensors.index.json").exists() == sharded
    return directory


@pytest.fixture(scope="module", params=["one_file", "sharded"])
def checkpoint(request, tmp_path_factory):
    return saved_llama(tmp_path_factory.mktemp(request.param), sharded=request.param == "sharded")


@pytest.fixture(scope="module")
def sharded_checkpoint(tmp_path_factory):
    return saved_llama(tmp_path_factory.mktemp("sharded"), sharded=True)


def transformers_loss(directory, run, samples: int) -> float:
    """transformers' own model's mean loss on the first `samples` samples the lab draws (step 1's global batch)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="sdpa")
    (inputs, targets), = microbatches(build_meta(run.model), seed=run.train.seed, first_sample=0, batch_size=samples,
                                      seq_len=run.train.seq_len, n=1, device=torch.device("cpu"))
    with torch.no_grad():
        return float(cross_entropy(model(inputs).logits.flatten(0, -2), targets.flatten()))


def test_the_first_step_has_transformers_own_loss(prepared, world_of_one, checkpoint):
    run, dims = prepared(*RUN, f"model.pretrained={checkpoint}", "mesh=single")
    rows = []
    trainer = build_trainer(run, dims, world_of_one, on_step=rows.append)
    trainer.run()
    assert rows[0]["loss"] == pytest.approx(transformers_loss(checkpoint, run, samples=2), abs=1e-5)
    assert rows[0]["parity/loss_abs_diff"] < 1e-6  # the reference loaded the same weights


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_reads_only_the_slices_its_shards_hold(fake_group, prepared, checkpoint, rank):
    from safetensors.torch import load_file

    run, _ = prepared(*RUN, f"model.pretrained={checkpoint}", "mesh=single")
    fake_group(2, rank)
    model = sharded_on_two_fake_ranks(run.model, rank, seed=0)
    saved = {}
    for f in sorted(checkpoint.glob("*.safetensors")):
        saved.update(load_file(f))
    whole_mib = sum(t.numel() * t.element_size() for t in saved.values()) / 2**20
    assert model.pretrained_load["read_mib"] == pytest.approx(whole_mib / 2, rel=0.05), "half the model: this rank's rows"
    for name, p in model.named_parameters():
        assert torch.equal(p.to_local(), saved[name.removeprefix("inner.")].chunk(2)[rank]), name


def test_a_checkpoint_that_does_not_fit_the_model_is_refused(prepared, checkpoint):
    with pytest.raises(ConfigError, match=r"model.pretrained=.*: the checkpoint has other shapes: model.embed_tokens.weight \[128, 32\] \(the model's: \[256, 32\]\)"):
        prepared(*RUN, f"model.pretrained={checkpoint}", "model.config.vocab_size=256", "mesh=single")
    with pytest.raises(ConfigError, match="model.pretrained=/no/such: no such file or directory"):
        prepared(*RUN, "model.model_type=llama", "model.pretrained=/no/such", "mesh=single")


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["mesh=fsdp", "mesh=hsdp", "mesh=tp2d"])
def test_every_sharded_mesh_starts_from_the_checkpoint(sharded_checkpoint, tmp_path, mesh, compose_run):
    checkpoint = sharded_checkpoint
    result = run_lab_warm(*RUN, f"model.pretrained={checkpoint}", mesh, run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr[-2000:]
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    run = compose_run(*RUN, f"model.pretrained={checkpoint}", mesh)
    dp = result.summary["mesh"]["dp_replicate"] * result.summary["mesh"]["dp_shard"]
    assert first["loss"] == pytest.approx(transformers_loss(checkpoint, run, samples=2 * dp), abs=1e-5)
    assert result.summary["parity"]["ok"]
