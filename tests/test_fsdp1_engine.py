"""mesh.engine=fsdp1 (FullyShardedDataParallel) with each 1-D sharding strategy trains with parity
against DDP; its knobs reach FSDP1: mixed precision shows in the loss, sharding in the memory a rank
holds. (HSDP strategies: test_fsdp1_hybrid.py.)"""

from __future__ import annotations

import pytest

from warm_lab import run_lab_warm
from parity_runs import FSDP1, PARITY_RUN, assert_parity_ok, fsdp1_strategy_line

pytestmark = pytest.mark.slow
STRATEGY_RUNS = {
    # The size policy on dim 17 x ffn 51: each in_proj (918 params) is a unit, out_proj (884) stays in the root.
    "full_shard": ["fsdp.sharding_strategy=full_shard", "fsdp.use_orig_params=true", "wrap=size", "wrap.min_params=900",
                   "fsdp.forward_prefetch=1", "fsdp.backward_prefetch_policy=backward_post"],
    "shard_grad_op": ["fsdp.reshard_after_forward=false", "wrap.policy=classes", "wrap.classes=[Linear]", "probes.memory.enabled=true"],
    "no_shard": ["fsdp.sharding_strategy=no_shard", "fsdp.backward_prefetch_policy=off", "probes.memory.enabled=true"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp1")
    return {name: run_lab_warm(*PARITY_RUN, *FSDP1, *overrides, run_dir=root / name) for name, overrides in STRATEGY_RUNS.items()}


@pytest.mark.parametrize("strategy", list(STRATEGY_RUNS))
def test_strategy_matches_ddp(runs, strategy):
    s = assert_parity_ok(runs[strategy])
    assert s["mesh"]["engine"] == "fsdp1"
    assert f" {strategy} on mesh" in fsdp1_strategy_line(runs[strategy])


def test_no_shard_holds_twice_the_parameters_and_state_of_shard_grad_op(runs):
    # Step 2 starts with parameters and SGD momentum: all of them under no_shard, half under shard_grad_op.
    no_shard, sharded = (runs[n].metrics[1]["memory/start_mib"] for n in ("no_shard", "shard_grad_op"))
    assert no_shard > 1.7 * sharded > 0, (no_shard, sharded)


def test_bf16_params_state_their_tolerance_and_differ_from_fp32(tmp_path):
    result = run_lab_warm(*PARITY_RUN, *FSDP1, "fsdp.param_dtype=bfloat16", run_dir=tmp_path / "run")
    p = assert_parity_ok(result, tolerance=5e-2)["parity"]
    assert p["max_loss_abs_diff"] > 1e-4, "bf16 compute must show against the fp32 reference"
