"""Engine and mesh combinations that cannot work are refused before any rank starts, with one line
naming the keys, the values and what is allowed (the exit code and the printed line: test_bad_input.py)."""

from __future__ import annotations

import pytest

from fsdp_lab.config import ConfigError


@pytest.mark.parametrize(
    "overrides,message",
    [
        ("mesh=ddp fsdp.cpu_offload=true", "fsdp.cpu_offload=true: applies to mesh.engine=fsdp2|fsdp1, not mesh.engine=ddp"),
        ("mesh=ddp fsdp.param_dtype=bfloat16", "fsdp.param_dtype=bfloat16: applies to mesh.engine=fsdp2|fsdp1, not mesh.engine=ddp"),
        ("mesh=ddp fsdp.reshard_after_forward=false", "fsdp.reshard_after_forward=false: applies to mesh.engine=fsdp2|fsdp1, not mesh.engine=ddp"),
        ("fsdp.sharding_strategy=no_shard", "fsdp.sharding_strategy=no_shard: applies to mesh.engine=fsdp1, not mesh.engine=fsdp2"),
        ("fsdp.use_orig_params=true", "fsdp.use_orig_params=true: applies to mesh.engine=fsdp1, not mesh.engine=fsdp2"),
        ("fsdp.backward_prefetch_policy=off", "fsdp.backward_prefetch_policy=off: applies to mesh.engine=fsdp1, not mesh.engine=fsdp2"),
        ("mesh.engine=fsdp1 fsdp.backward_prefetch=1", "fsdp.backward_prefetch=1: applies to mesh.engine=fsdp2, not mesh.engine=fsdp1"),
        ("mesh.engine=fsdp1 fsdp.cast_forward_inputs=false", "fsdp.cast_forward_inputs=false: applies to mesh.engine=fsdp2, not mesh.engine=fsdp1"),
        ("mesh=hsdp mesh.engine=fsdp1 fsdp.reshard_after_forward=2",
         "fsdp.reshard_after_forward=2 with mesh.engine=fsdp1: allowed are true, false"),
        ("mesh.engine=fsdp1 fsdp.sharding_strategy=full_shard fsdp.reshard_after_forward=false",
         "fsdp.reshard_after_forward=false with fsdp.sharding_strategy=full_shard: full_shard reshards after forward; "
         "allowed: sharding_strategy=auto|shard_grad_op|hybrid_shard_zero2|no_shard"),
        ("mesh.engine=fsdp1 fsdp.forward_prefetch=2", "fsdp.forward_prefetch=2 with mesh.engine=fsdp1: fsdp1 prefetches one unit; allowed: 0, 1"),
        ("mesh.engine=fsdp1 fsdp.sharding_strategy=hybrid_shard",
         "fsdp.sharding_strategy=hybrid_shard: needs mesh.dp_replicate > 1 (e.g. mesh=hsdp), got mesh.dp_replicate=1"),
        ("mesh=hsdp mesh.engine=fsdp1 fsdp.sharding_strategy=shard_grad_op",
         "fsdp.sharding_strategy=shard_grad_op with mesh.dp_replicate=2: a replicated mesh takes auto, hybrid_shard or hybrid_shard_zero2"),
        ("mesh=hsdp mesh.engine=fsdp1 mesh.cpu_world_size=2",
         "mesh.dp_shard=1 with mesh.dp_replicate=2 and mesh.engine=fsdp1: fsdp1 cannot replicate without sharding; "
         "allowed: mesh.dp_shard >= 2, or mesh.engine=fsdp2|ddp"),
        ("mesh.engine=fsdp1 mesh.tp=2", "mesh.tp=2 with mesh.engine=fsdp1: fsdp1 runs on data-parallel meshes only; allowed: mesh.engine=fsdp2"),
        ("mesh.engine=fsdp1 fsdp.cpu_offload=true device=cpu",
         "fsdp.cpu_offload=true with mesh.engine=fsdp1 on CPU: FSDP1's CPUOffload needs an accelerator; allowed: false"),
        ("mesh.engine=fsdp1 model.compile=true", "model.compile=true with mesh.engine=fsdp1: needs fsdp.use_orig_params=true"),
        ("mesh.engine=fsdp1 wrap.group=2",
         "wrap.group=2 with mesh.engine=fsdp1: only fully_shard shards several modules as one unit; allowed: 1, or mesh.engine=fsdp2"),
        ("wrap.group=2 model.layer_order=[0,0,1]",
         "model.layer_order=[0, 0, 1] with wrap.group=2: grouped units run each block once, in order; allowed: wrap.group=1"),
        ("model=mlp_stack wrap=root train.standalone_layer=0",
         "train.standalone_layer=0 with wrap.policy=root: a unit around the block holds some of its parameters and does not gather them "
         "when the block runs alone; allowed: wrap=block, or a policy that makes every module holding the block's parameters a unit"),
        ("mesh=hsdp mesh.cpu_world_size=6 mesh.dp_replicate=4",
         "mesh: pp=1 x dp_replicate=4 x tp=1 = 4 does not divide the world size 6, so mesh.dp_shard=-1 cannot fill it"),
    ],
)
def test_impossible_combination_is_refused_with_one_line(prepared, overrides, message):
    with pytest.raises(ConfigError) as raised:
        prepared(*overrides.split())
    assert str(raised.value) == message


def test_presets_resolve_their_cpu_world(prepared):
    shapes = {m: prepared(f"mesh={m}", "device=cpu")[1] for m in ("single", "ddp", "fsdp", "hsdp")}
    assert {m: (d.world_size, d.dp_replicate, d.dp_shard) for m, d in shapes.items()} == {
        "single": (1, 1, 1), "ddp": (2, 1, 2), "fsdp": (2, 1, 2), "hsdp": (4, 2, 2),
    }
    assert prepared("mesh=hsdp", "device=cpu", "mesh.world_size=8")[1].dp_shard == 4

