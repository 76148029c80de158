"""The sweeps of two torch_* scenario families, each point a real 2-rank training run (one torchrun
for all of them: tests/ckpt_finetune_matrix.py):

- test_fsdp_checkpoint: FSDP(checkpoint(layer)), checkpoint(FSDP(layer)) and manual checkpoint calls,
  each with activation offload on and off, under FSDP1 with use_orig_params on and off and FSDP2
  with CPU parameter offload (FSDP1's needs a GPU), train exactly like plain FSDP and like DDP;
- test_fsdp_fine_tune: every other linear frozen, a frozen layer with an unused input, a layer run
  several times per forward (partly under no_grad), under FULL_SHARD, SHARD_GRAD_OP and NO_SHARD:
  parity with DDP and the frozen parameters bitwise unchanged."""

from __future__ import annotations

import json

import pytest

from ckpt_finetune_matrix import (
    ENGINE_POINTS, FINE_TUNE_EXPERIMENTS, STRATEGIES, all_variants, checkpoint_variants,
    composition_variants, fine_tune_variants,
)
from matrix_rank import launch, result_of

pytestmark = pytest.mark.slow  # every test reads the matrix trained by 2 real ranks

CHECKPOINT_WRAPPERS = {"full": "CheckpointWrapper", "offload": "OffloadWrapper"}
MANUAL_RUNNERS = {"full": "checkpoint", "offload": "_on_cpu"}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> dict:
    return launch("ckpt_finetune_matrix", tmp_path_factory.mktemp("ckpt_finetune"))


def test_the_matrix_runs_every_point_of_both_sweeps(matrix):
    assert set(matrix) == set(all_variants())
    for experiment in FINE_TUNE_EXPERIMENTS:
        ran = {label.split("/")[1] for label in matrix if label.startswith(f"{experiment}/")}
        assert set(STRATEGIES) <= ran, experiment


@pytest.mark.parametrize("label", sorted(all_variants()))
def test_every_verdict_holds(matrix, label):
    checks = result_of(matrix, label)["checks"]
    assert checks and all(v["ok"] is True for v in checks.values()), checks
    parity = checks["parity_ok"]["value"]
    assert parity["max_loss_abs_diff"] <= 1e-5 and parity["max_param_abs_diff"] <= 1e-5


def _baseline(label: str) -> str:
    engine, point = label.split("/")[:2]
    return f"{engine}/{point}/none"


@pytest.mark.parametrize("label", sorted(k for k in checkpoint_variants() if not k.endswith("/none")))
def test_checkpointed_fsdp_trains_exactly_like_plain_fsdp(matrix, label):
    """test_fsdp_checkpoint's _verify_parity: the same losses as FSDP without checkpointing, step by step."""
    assert matrix[label]["losses"] == matrix[_baseline(label)]["losses"]


@pytest.mark.parametrize("engine", ENGINE_POINTS)
def test_each_implementation_nests_as_its_name_says(matrix, engine):
    fsdp1 = engine == "fsdp1"
    for point in ENGINE_POINTS[engine]:
        for mode in ("full", "offload"):
            prefix, wrapper = f"{engine}/{point}", CHECKPOINT_WRAPPERS[mode]
            # FSDP(checkpoint(layer)): FSDP1 wraps the wrapper; FSDP2 makes the wrapper its unit (FSDP<class>).
            inner = matrix[f"{prefix}/wrapper/{mode}"]["nesting"]
            assert inner == (["FullyShardedDataParallel", wrapper, "MLP"] if fsdp1 else [f"FSDP{wrapper}", "MLP"])
            # checkpoint(FSDP(layer)): the wrapper around the FSDP unit.
            outer = matrix[f"{prefix}/outer_wrapper/{mode}"]["nesting"]
            assert outer == ([wrapper, "FullyShardedDataParallel", "MLP"] if fsdp1 else [wrapper, "FSDPMLP"])
            # Manual calls: plain FSDP units, the model's forward calls checkpoint/save_on_cpu on each.
            manual = matrix[f"{prefix}/manual/{mode}"]
            assert manual["nesting"] == (["FullyShardedDataParallel", "MLP"] if fsdp1 else ["FSDPMLP"])
            assert manual["manual"] == {str(i): MANUAL_RUNNERS[mode] for i in range(3)}


@pytest.mark.parametrize("label", sorted(k for k in checkpoint_variants() if k.endswith("/full")))
def test_checkpointing_lowers_memory_after_forward(matrix, label):
    """The recomputation really happens: fewer activations are held after forward than without AC."""
    assert matrix[label]["after_fwd_mib"] < matrix[_baseline(label)]["after_fwd_mib"]


def test_outer_and_manual_checkpointing_compose_with_reentrant_selective_and_ddp(matrix):
    assert len({json.dumps(matrix[label]["losses"]) for label in composition_variants()}) == 1
    assert matrix["transformer/fsdp1/outer_wrapper/reentrant"]["nesting"][:2] == ["CheckpointWrapper", "FullyShardedDataParallel"]


@pytest.mark.parametrize("label", sorted(fine_tune_variants()))
def test_fine_tuning_leaves_the_frozen_parameters_bitwise_unchanged(matrix, label):
    frozen = matrix[label]["frozen"]
    assert frozen["max_abs_change"] == 0.0 and frozen["compared_numel"] > 0
    # in_proj of 3 MLPs, or one linear (weight + bias)
    assert frozen["params"] == (6 if label.startswith("torch_fine_tune/") else 2)


@pytest.mark.parametrize("experiment", FINE_TUNE_EXPERIMENTS)
def test_sharding_strategies_differ_where_they_should(matrix, experiment):
    """The strategies are really applied: FULL_SHARD frees the gathered parameters after forward,
    SHARD_GRAD_OP keeps them; NO_SHARD compares every element of the frozen parameters on each rank."""
    at = {s: matrix[f"{experiment}/{s}/use_orig_params=false"] for s in STRATEGIES}
    assert at["full_shard"]["after_fwd_mib"] < at["shard_grad_op"]["after_fwd_mib"]
    assert at["no_shard"]["frozen"]["compared_numel"] == 2 * at["full_shard"]["frozen"]["compared_numel"]
    losses = {json.dumps(v["losses"]) for k, v in matrix.items() if k.startswith(f"{experiment}/")}
    assert len(losses) == 1, "every strategy, use_orig_params and FSDP2 train alike"
