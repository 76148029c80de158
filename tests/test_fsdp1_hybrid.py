"""mesh=hsdp with mesh.engine=fsdp1: the 2-D (dp_replicate, dp_shard) mesh gives HYBRID_SHARD, or
its ZeRO-2 variant without resharding, on 4 CPU ranks, with parity against DDP over all 4."""

from __future__ import annotations

import pytest

from warm_lab import run_lab_warm
from parity_runs import FSDP1, PARITY_RUN, assert_parity_ok, fsdp1_strategy_line

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "overrides,strategy",
    [
        ([], "hybrid_shard"),
        (["fsdp.reshard_after_forward=false", "fsdp.use_orig_params=true"], "hybrid_shard_zero2"),
    ],
    ids=["auto", "auto-no-reshard"],
)
def test_hsdp_mesh_derives_the_hybrid_strategy_and_matches_ddp(tmp_path, overrides, strategy):
    result = run_lab_warm("mesh=hsdp", *PARITY_RUN, *FSDP1, *overrides, run_dir=tmp_path / "run")
    s = assert_parity_ok(result)
    assert (s["world_size"], s["mesh"]["dp_replicate"], s["mesh"]["dp_shard"]) == (4, 2, 2)
    assert f" {strategy} on mesh" in fsdp1_strategy_line(result)
