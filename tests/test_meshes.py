"""Every mesh preset trains with parity against DDP over its data-parallel group: real ranks on
CPU/gloo, the odd-sized MLP stack (dim 17: uneven shards), SGD with momentum (exposes gradient
averaging bugs that Adam's scale invariance hides)."""

from __future__ import annotations

import pytest

from lab import run_lab

COMMON = ("model=mlp_stack", "optim=sgd", "train.steps=6", "probes.parity.param_every=3", "probes.memory.enabled=false", "logger=none")


def assert_parity_ok(result, tolerance: float = 1e-5) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    s = result.summary
    p = s["parity"]
    assert s["status"] == "ok" and s["steps"] == 6
    assert p["ok"] and p["tolerance"] == tolerance
    assert p["max_loss_abs_diff"] <= tolerance and p["max_param_abs_diff"] <= tolerance, p
    assert sum("parity/param_max_abs_diff" in r for r in result.metrics) == 2, "parameters compared at steps 3 and 6"
    return s


@pytest.mark.parametrize(
    "overrides,mesh",
    [
        (["mesh=single"], {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1, "engine": "fsdp2"}),
        (["mesh=ddp"], {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 1, "engine": "ddp"}),
        # The size policy on dim 17 x ffn 51: each in_proj (918 params) is a unit, out_proj (884) stays in the root.
        (["mesh=fsdp", "wrap=size", "wrap.min_params=900"], {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 1, "engine": "fsdp2"}),
        (["mesh=hsdp", "wrap.policy=classes", "wrap.classes=[Linear]"], {"pp": 1, "dp_replicate": 2, "dp_shard": 2, "tp": 1, "engine": "fsdp2"}),
    ],
    ids=["single", "ddp", "fsdp-size-policy", "hsdp-classes-policy"],
)
def test_mesh_preset_matches_ddp(tmp_path, overrides, mesh):
    s = assert_parity_ok(run_lab(*overrides, *COMMON, run_dir=tmp_path / "run"))
    assert s["mesh"] == mesh
    assert s["world_size"] == mesh["pp"] * mesh["dp_replicate"] * mesh["dp_shard"] * mesh["tp"]
