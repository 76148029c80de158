"""Every causal-LM family of the pinned transformers under model=hf (fsdp_lab/models/hf_families.py):
a tiny config from the family's own config class; the families the lab cannot run refused before
any rank starts with a one-line reason; a sample trained in process with parity (gpt2 with its
dropout, mixtral's experts, gemma2's eager attention), and the families the issue names on fsdp and
ddp over 2 ranks in the slow tier (benchmarks/hf_families.py, which also writes docs/hf_families.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmark_scripts import load
from fsdp_lab.cli_process import REPO, lab_env
from fsdp_lab.config import ConfigError
from fsdp_lab.models.hf_families import tiny_config, tiny_overrides
from fsdp_lab.worker import build_trainer

NAMED = ["llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "gpt2", "gpt_neox", "opt",
         "falcon", "olmo2", "granite", "starcoder2"]
ONE_RANK = ["train.steps=2", "train.seq_len=8", "train.batch_size=2", "probes.parity.param_every=1", "logger=none", "mesh=single"]


def test_a_tiny_config_uses_the_familys_own_names():
    assert {k: tiny_config("gpt2")[k] for k in ("n_embd", "n_layer", "n_head", "vocab_size")} == {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 128}
    mixtral = tiny_config("mixtral")
    assert mixtral["num_local_experts"] == 4 and mixtral["num_experts_per_tok"] == 2
    # Latent attention needs as many key/value heads as query heads, as the family's default has.
    assert tiny_config("deepseek_v3")["num_key_value_heads"] == tiny_config("deepseek_v3")["num_attention_heads"]
    assert tiny_config("mistral")["num_key_value_heads"] == 2  # grouped-query by default: grouped-query tiny


@pytest.mark.parametrize(("model_type", "reason"), [
    ("gemma3", "a composite (multimodal) model: its config nests text_config, vision_config; the lab trains text-only causal LMs; its text model is model.model_type=gemma3_text"),
    ("bart", "an encoder-decoder model; the lab trains decoder-only causal LMs"),
])
def test_a_family_the_lab_cannot_run_is_refused_before_any_rank_starts(prepared, model_type, reason):
    with pytest.raises(ConfigError) as refused:
        prepared(*tiny_overrides(model_type), *ONE_RANK)
    assert str(refused.value) == f"model.model_type={model_type}: {reason}"


@pytest.mark.parametrize("model_type", ["gpt2", "mixtral", "gemma2"])
def test_a_sample_of_families_trains_with_parity_in_process(prepared, world_of_one, model_type):
    run, dims = prepared(*tiny_overrides(model_type), *ONE_RANK)
    trainer = build_trainer(run, dims, world_of_one, on_step=lambda row: None)
    trainer.run()
    verdict = trainer.reference.verdict
    assert verdict.ok and verdict.max_loss_abs_diff == 0.0, verdict


@pytest.mark.slow
def test_the_named_families_hold_parity_on_fsdp_and_ddp(tmp_path):
    # The benchmark's own command line: its ranks fork from a fresh interpreter, not from this test
    # process, whose threads (from earlier tests) a forked rank could inherit as held locks.
    bench, rows_file, doc = load("hf_families"), tmp_path / "rows.json", tmp_path / "hf_families.md"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "hf_families.py"), "--families", *NAMED, "--out", str(rows_file),
                           "--doc", str(doc), "--no-wider"], cwd=REPO, env=lab_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads(rows_file.read_text())
    failed = {r["family"]: r.get("refused") or r.get("error") or r["runs"] for r in rows if not bench.passes(r)}
    assert not failed, failed
    assert "| gpt2 | parity ok | parity ok |" in doc.read_text()
