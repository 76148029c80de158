"""Every mesh preset trains with parity against DDP over its data-parallel group: real ranks on
CPU/gloo, the odd-sized MLP stack (dim 17: uneven shards), SGD with momentum (exposes gradient
averaging bugs that Adam's scale invariance hides)."""

from __future__ import annotations

import pytest

from warm_lab import run_lab_warm
from parity_runs import PARITY_RUN, assert_parity_ok

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "overrides,mesh",
    [
        (["mesh=single"], {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1, "engine": "fsdp2"}),
        (["mesh=ddp"], {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 1, "engine": "ddp"}),
        # The size policy on dim 17 x ffn 51: each in_proj (918 params) is a unit, out_proj (884) stays in the root.
        (["mesh=fsdp", "wrap=size", "wrap.min_params=900"], {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 1, "engine": "fsdp2"}),
        (["mesh=hsdp", "wrap.policy=classes", "wrap.classes=[Linear]"], {"pp": 1, "dp_replicate": 2, "dp_shard": 2, "tp": 1, "engine": "fsdp2"}),
        # The 3 blocks as units of 2 and 1 (fully_shard over a list): uneven groups.
        (["mesh=fsdp", "wrap.group=2"], {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 1, "engine": "fsdp2"}),
        # Gradients summed over shards and replicas, then divided: a division left out doubles or quadruples them.
        (["mesh=hsdp", "fsdp.force_sum_reduction=true"], {"pp": 1, "dp_replicate": 2, "dp_shard": 2, "tp": 1, "engine": "fsdp2"}),
    ],
    ids=["single", "ddp", "fsdp-size-policy", "hsdp-classes-policy", "fsdp-grouped-units", "hsdp-sum-reduction"],
)
def test_mesh_preset_matches_ddp(tmp_path, overrides, mesh):
    s = assert_parity_ok(run_lab_warm(*overrides, *PARITY_RUN, run_dir=tmp_path / "run"))
    assert s["mesh"] == mesh
    assert s["world_size"] == mesh["pp"] * mesh["dp_replicate"] * mesh["dp_shard"] * mesh["tp"]
