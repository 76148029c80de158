"""Activation checkpointing: every mode x implementation trains exactly like ac=none (the lab's own
parity probe against a DDP reference without AC), composed with FSDP2, DDP and FSDP2 with CPU
parameter offload, and saves the activation memory it should (the memory probe's after_fwd)."""

from __future__ import annotations

import pytest

from ac_matrix import IMPLS, MODES, variants
from fsdp_lab.config import ConfigError
from in_process import run_lab_here
from matrix_rank import launch, result_of


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> dict:
    return launch("ac_matrix", tmp_path_factory.mktemp("ac"))


@pytest.mark.slow
def test_matrix_covers_every_mode_and_implementation(matrix):
    assert set(matrix) == set(variants())
    assert {f"{mode}/{impl}" for mode in MODES for impl in IMPLS} <= set(matrix)


@pytest.mark.slow
@pytest.mark.parametrize("label", sorted(variants()))
def test_every_variant_trains_like_no_checkpointing(matrix, label):
    result = result_of(matrix, label)
    parity = result["parity"]
    assert parity["ok"], parity
    assert parity["max_loss_abs_diff"] <= 1e-5 and parity["max_param_abs_diff"] <= 1e-5
    assert result["losses"] == pytest.approx(result_of(matrix, "none")["losses"], abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
def test_checkpointing_frees_activation_memory_after_forward(matrix, impl):
    none = matrix["none"]["after_fwd_mib"]
    full, layer, op = (matrix[f"{mode}/{impl}"]["after_fwd_mib"] for mode in ("full", "selective_layer", "selective_op"))
    assert full < none / 3, "recomputing every block keeps only the block inputs"
    assert full < layer < none, "checkpointing every 2nd block saves about half"
    assert full < op < none, "keeping matmul outputs saves less than recomputing everything"


@pytest.mark.slow
def test_implementations_save_the_same_activations(matrix):
    for mode in ("full", "selective_layer", "selective_op"):
        figures = {matrix[f"{mode}/{impl}"]["after_fwd_mib"] for impl in IMPLS}
        assert max(figures) - min(figures) < 1e-3, (mode, figures)


@pytest.mark.slow
def test_checkpointing_saves_memory_under_ddp_and_cpu_offload_too(matrix):
    for tag in ("ddp", "cpu_offload"):
        assert matrix[f"full/composable/{tag}"]["after_fwd_mib"] < matrix[f"offload/utils/{tag}"]["after_fwd_mib"]


def test_cli_run_with_selective_op_ac_on_the_default_transformer(tmp_path):
    # The CLI as rank 0 of 1, in this process (the matrix above trains every mode on 2 ranks).
    result = run_lab_here("ac=selective", "ac.selective=op", "ac.impl=wrapper", "train.steps=3", "logger=none", run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ac: mode=selective impl=wrapper on 1 of 2 blocks, selective=op" in result.stdout + result.stderr
    s = result.summary
    assert s["parity"]["ok"] and s["parity"]["max_param_abs_diff"] <= 1e-5


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["ac=full", "ac.reentrant=true"], "ac.reentrant=true: the composable checkpoint is non-reentrant only"),
        (["ac=offload", "ac.impl=utils", "ac.reentrant=true"], "not ac.mode=offload"),
        (["ac=selective", "ac.selective=op", "ac.impl=utils", "ac.reentrant=true"], "with ac.selective=op"),
        (["ac=full", "ac.impl=utils", "ac.reentrant=true", "model=mlp_stack"], "would drop that block's gradients"),
        (["ac=selective", "ac.every=0"], "ac.every=0: allowed is >= 1"),
        (["ac=full", "ac.impl=checkpoint"], "ac.impl=checkpoint: allowed are composable, utils, wrapper"),
    ],
)
def test_bad_ac_settings_are_refused_before_any_rank_starts(prepared, overrides, message):
    with pytest.raises(ConfigError, match=message):
        prepared("device=cpu", *overrides)
