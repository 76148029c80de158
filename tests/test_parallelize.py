"""Each parallelize step (fsdp_lab/parallel/), run in process by the worker's own `build_trainer` on
a config composed from conf/: on a fake process group, what it builds (shards, units, wrappers,
stages, dtypes); on a real world of one rank, what activation checkpointing does to a forward.
Without any one step, a test here fails."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.nn.parallel import DistributedDataParallel

from fsdp_lab.config import ConfigError
from fsdp_lab.data import microbatches
from fsdp_lab.dist import DistContext
from fsdp_lab.models import build_model, count_params
from fsdp_lab.parallel.fsdp2 import param_groups
from fsdp_lab.parallel.pipeline import PipelinedModel
from fsdp_lab.parallel.wrap import wrap_units
from fsdp_lab.modules import unwrap
from fsdp_lab.step import loss_fn
from fsdp_lab.worker import build_trainer

TINY = ("debug=cpu_tiny", "probes=off")  # no reference: the model under test is the only one built


@pytest.fixture
def built(prepared, fake_group):
    """`built(*overrides, rank=0) -> (run, dims, model)`: the parallelized model of `rank` of the run's
    world, which a fake group stands in for."""
    def build(*overrides: str, rank: int = 0):
        run, dims = prepared(*TINY, *overrides)
        fake_group(dims.world_size, rank)
        ctx = DistContext(rank=rank, local_rank=rank, world_size=dims.world_size, device=torch.device("cpu"))
        return run, dims, build_trainer(run, dims, ctx, on_step=lambda row: None).model
    return build


def local_rows(param: nn.Parameter) -> int:
    return param.to_local().shape[0]


# FSDP2, FSDP1, DDP: the data-parallel engines.


def test_fsdp2_makes_each_block_a_unit_and_shards_every_parameter_over_dp_shard(built):
    _, _, model = built()
    assert isinstance(model, FSDPModule) and all(isinstance(b, FSDPModule) for b in model.layers)
    for name, p in model.named_parameters():
        assert isinstance(p, DTensor) and p.placements == (Shard(0),), name
        assert p.device_mesh.mesh_dim_names == ("dp_shard",) and local_rows(p) == math.ceil(p.shape[0] / 2), name


def test_hsdp_shards_within_a_replica_and_replicates_across(built):
    _, _, model = built("mesh=hsdp")
    for name, p in model.named_parameters():
        assert p.device_mesh.mesh_dim_names == ("dp_replicate", "dp_shard"), name
        assert p.placements == (Replicate(), Shard(0)), name


def test_fsdp2_knobs_reach_fully_shard(built):
    _, _, model = built("fsdp.reshard_after_forward=false", "fsdp.param_dtype=bfloat16", "fsdp.forward_prefetch=1",
                        "fsdp.backward_prefetch=1")
    first, second = (block._get_fsdp_state() for block in model.layers)
    group = first._fsdp_param_group
    assert group.post_forward_mesh_info is None, "reshard_after_forward=false keeps parameters gathered"
    assert group.mp_policy.param_dtype == torch.bfloat16
    assert first._states_to_forward_prefetch == [second] and second._states_to_backward_prefetch == [first]


@pytest.mark.parametrize("prefetch", [True, False])
def test_the_last_unit_is_gathered_ahead_of_the_loss_s_backward_only_with_root_backward_prefetch(built, prefetch):
    """FSDP2 all-gathers the last unit when the root's backward starts (the output layer and the loss's
    gradient: a language model's memory peak); fsdp.root_backward_prefetch=false leaves it sharded
    there, to be gathered when its own backward starts."""
    run, _, model = built("model.n_layers=3", "wrap.group=1", f"fsdp.root_backward_prefetch={str(prefetch).lower()}")
    last = model.layers[-1]._get_fsdp_state()._fsdp_param_group
    gathered_at_output = []
    model.output.register_full_backward_pre_hook(
        lambda *_: gathered_at_output.append(last._all_gather_result is not None or last.is_unsharded))
    model(torch.randint(0, run.model.vocab_size, (2, run.train.seq_len))).float().sum().backward()
    assert gathered_at_output == [prefetch]


def test_without_cast_forward_inputs_only_the_root_casts(built):
    _, _, model = built("fsdp.param_dtype=bfloat16", "fsdp.cast_forward_inputs=false")
    assert model._get_fsdp_state()._mp_policy.cast_forward_inputs, "the root casts the model's inputs"
    assert not any(block._get_fsdp_state()._mp_policy.cast_forward_inputs for block in model.layers)


def test_wrap_group_shards_consecutive_blocks_as_one_unit_and_prefetches_group_to_group(built):
    _, _, model = built("model.n_layers=5", "wrap.group=2", "fsdp.forward_prefetch=1")
    states = [block._get_fsdp_state() for block in model.layers]
    assert states[0] is states[1] and states[2] is states[3] and len({id(s) for s in states}) == 3
    first_group = states[0]._fsdp_param_group
    assert {id(p) for p in (fp.sharded_param for fp in first_group.fsdp_params)} == {
        id(p) for block in model.layers[:2] for p in block.parameters()}, "one parameter group holds both blocks"
    assert states[0]._states_to_forward_prefetch == [states[2]] and states[2]._states_to_forward_prefetch == [states[4]]


def test_wrap_group_keeps_a_unit_of_another_class_on_its_own(built):
    """policy=classes wraps the embedding beside the blocks: grouping 4 to a unit takes blocks only
    (grouped with the compiled TP blocks after it, the embedding ran with its weight still sharded)."""
    _, _, model = built("model.n_layers=5", "wrap.policy=classes", "wrap.classes=[Embedding,TransformerBlock]", "wrap.group=4")
    embedding = model.tok_embeddings._get_fsdp_state()
    states = [block._get_fsdp_state() for block in model.layers]
    assert embedding not in states and {id(p) for p in (fp.sharded_param for fp in embedding._fsdp_param_group.fsdp_params)} == {
        id(model.tok_embeddings.weight)}
    assert all(s is states[0] for s in states[:4]) and states[4] is not states[0]


def test_fsdp1_wraps_the_same_units_with_the_strategy_the_mesh_asks_for(built):
    run, _, model = built("mesh.engine=fsdp1")
    assert isinstance(model, FSDP) and all(isinstance(b, FSDP) for b in unwrap(model).layers)
    assert model.sharding_strategy == ShardingStrategy.FULL_SHARD
    total = count_params(build_model(run.model, seed=0))
    local = sum(p.numel() for p in model.parameters())  # a flat shard per unit, padded to halves
    assert total / 2 <= local < total / 2 + 8, (local, total)
    _, _, hybrid = built("mesh=hsdp", "mesh.engine=fsdp1")
    assert hybrid.sharding_strategy == ShardingStrategy.HYBRID_SHARD


def test_ddp_replicates_over_the_flattened_dp_group(built):
    _, dims, model = built("mesh=hsdp", "mesh.engine=ddp")
    assert isinstance(model, DistributedDataParallel)
    assert model.process_group.size() == dims.dp == 4
    assert not any(isinstance(p, DTensor) for p in model.parameters())


# Wrap policies: which modules become units.


@pytest.mark.parametrize(
    "overrides,units",
    [
        ((), ["layers.0", "layers.1"]),
        (("wrap=root",), []),
        (("wrap=linear",), [f"layers.{i}.{n}" for i in (0, 1) for n in (
            "attention.wq", "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1", "feed_forward.w2",
            "feed_forward.w3")] + ["output"]),
        (("wrap.policy=classes", "wrap.classes=[FeedForward]"), ["layers.0.feed_forward", "layers.1.feed_forward"]),
        # A block holds 2592 parameters: attention 4 x 16 x 16 = 1024, feed-forward 3 x 16 x 32 = 1536;
        # the embedding and the output 256 x 16 = 4096 each.
        (("wrap=size", "wrap.min_params=1000"), ["layers.0.attention", "layers.0.feed_forward", "layers.1.attention",
                                                  "layers.1.feed_forward", "output", "tok_embeddings"]),
        (("wrap=size", "wrap.min_params=1500"), ["layers.0.feed_forward", "layers.1.feed_forward", "output", "tok_embeddings"]),
        (("wrap=size", "wrap.min_params=2000"), ["layers.0", "layers.1", "output", "tok_embeddings"]),
    ],
    ids=["block", "root", "linear", "classes", "size-1000", "size-1500", "size-2000"],
)
def test_wrap_policy_chooses_the_units(built, overrides, units):
    _, _, model = built(*overrides)
    sharded = sorted(name for name, m in model.named_modules() if isinstance(m, FSDPModule) and m is not model)
    assert sharded == sorted(units)


def test_size_policy_takes_the_smallest_modules_reaching_min_params(compose_run):
    """size_based_auto_wrap_policy's rule on mlp_stack (dim 17, ffn 51): each in_proj (918 parameters)
    is a unit; out_proj (884) stays with the root, and a block is not taken once its in_proj is."""
    run = compose_run("model=mlp_stack", "wrap=size", "wrap.min_params=900")
    model = build_model(run.model, seed=0)
    assert wrap_units(model, run.wrap) == [layer.in_proj for layer in model.layers]


# TP, compile, activation checkpointing: the steps before the engine.


def test_tp_splits_the_block_linears_over_tp_before_fsdp_shards_over_dp(built):
    _, _, model = built("mesh=tp2d")
    wq, wo = model.layers[0].attention.wq.weight, model.layers[0].attention.wo.weight
    assert wq.device_mesh.mesh_dim_names == ("dp_shard", "tp") and wq.shape == (16, 16)
    assert wq.placements[1] == Shard(0) and wo.placements[1] == Shard(1), "column-wise in, row-wise out"
    assert wq.to_local().shape == (4, 16), "16 rows over tp=2, then over dp_shard=2"


def test_compile_compiles_every_block(built):
    _, _, model = built("model.compile=true")
    assert all(block._compiled_call_impl is not None for block in model.layers)
    _, _, plain = built()
    assert all(block._compiled_call_impl is None for block in plain.layers)


@pytest.mark.parametrize(
    "impl,nesting",
    [
        ("wrapper", ["FSDPCheckpointWrapper", "TransformerBlock"]),  # FSDP(checkpoint(block))
        ("outer_wrapper", ["CheckpointWrapper", "FSDPTransformerBlock"]),  # checkpoint(FSDP(block))
    ],
)
def test_checkpoint_wrappers_nest_in_the_orchestrators_order(built, impl, nesting):
    _, _, model = built("ac=full", f"ac.impl={impl}")
    for block in model.layers:
        assert [type(block).__name__, type(block._checkpoint_wrapped_module).__name__] == nesting


def batch(run, model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return microbatches(model, seed=0, first_sample=0, batch_size=run.train.batch_size, seq_len=run.train.seq_len,
                        n=1, device=torch.device("cpu"))


def saved_activation_bytes(run, model: nn.Module) -> int:
    """What autograd saves for backward in one forward, outside checkpointed regions (they save their
    inputs only) and offloaded ones (whose own hooks pack their tensors)."""
    saved = 0

    def pack(t: torch.Tensor):
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    (inputs, _), = batch(run, model)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(inputs)
    return saved


AC_IMPLS = ("composable", "utils", "wrapper", "outer_wrapper", "manual")


@pytest.mark.parametrize("mode", ["full", "offload"])
@pytest.mark.parametrize("impl", AC_IMPLS)
def test_every_ac_implementation_keeps_the_blocks_activations_out_of_autograd(on_one_rank, impl, mode):
    none = saved_activation_bytes(*on_one_rank("ac=none"))
    checkpointed = saved_activation_bytes(*on_one_rank(f"ac={mode}", f"ac.impl={impl}"))
    assert checkpointed < none / 2, (checkpointed, none)


def recomputed_flops(run, model: nn.Module) -> int:
    """FLOPs of one forward and backward: checkpointing recomputes in backward what it did not keep."""
    from torch.utils.flop_counter import FlopCounterMode

    (inputs, targets), = batch(run, model)
    with FlopCounterMode(display=False) as counter:
        loss_fn(model(inputs), targets).backward()
    return counter.get_total_flops()


def test_selective_checkpointing_keeps_and_recomputes_between_none_and_full(on_one_rank):
    """Every 2nd block (layer) saves about half the activations; keeping matmul outputs (op) spares
    their recomputation, which full checkpointing pays."""
    runs = {
        name: on_one_rank(*overrides) for name, overrides in {
            "none": ("ac=none",), "full": ("ac=full",), "layer": ("ac=selective", "ac.selective=layer", "ac.every=2"),
            "op": ("ac=selective", "ac.selective=op", "ac.every=1"),
        }.items()
    }
    saved = {name: saved_activation_bytes(*built) for name, built in runs.items()}
    assert saved["full"] < saved["layer"] < saved["none"], saved
    flops = {name: recomputed_flops(*built) for name, built in runs.items() if name != "layer"}
    assert flops["none"] <= flops["op"] < flops["full"], flops


# Steps the worker takes around parallelize: pipeline stages, casting after sharding.


@pytest.mark.parametrize("rank,layers,first,last", [(0, ["0", "1"], True, False), (4, ["2", "3"], False, True)])
def test_pipeline_gives_each_pp_rank_its_stage(built, rank, layers, first, last):
    """mesh=nd is pp=2 x dp_shard=2 x tp=2: ranks 0-3 hold the first stage, 4-7 the last."""
    _, dims, model = built("mesh=nd", "model.n_layers=4", rank=rank)
    assert dims.pp == 2 and isinstance(model, PipelinedModel)
    assert list(model.module.layers) == layers
    assert (model.has_first, model.has_last) == (first, last)
    assert (model.module.tok_embeddings is not None, model.module.output is not None) == (first, last)
    wq = model.module.layers[layers[0]].attention.wq.weight
    assert wq.device_mesh.mesh_dim_names == ("dp_shard", "tp"), "each stage is parallelized like a whole model"


def test_cast_after_sharding_turns_every_shard_to_the_dtype(built):
    _, _, model = built("fsdp.cast_after_sharding=float64")
    assert {p.to_local().dtype for p in model.parameters()} == {torch.float64}


def loss_and_grad_norm(run, model: nn.Module) -> tuple[float, float]:
    (inputs, targets), = batch(run, model)
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    grads = [p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad for p in model.parameters() if p.grad is not None]
    return float(loss), float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])))


def test_symm_mem_on_cpu_says_it_has_no_nccl_and_trains_as_without(on_one_rank, caplog):
    """gloo has no symmetric memory (torch's pool raises for a CPU device): the all-gathers stay
    FSDP's own, with a line saying so, and no number changes."""
    without = loss_and_grad_norm(*on_one_rank())
    with caplog.at_level("INFO", logger="fsdp_lab.parallel.symm_mem"):
        assert loss_and_grad_norm(*on_one_rank("fsdp.symm_mem=true")) == without
    assert "fsdp.symm_mem=true has no NCCL on cpu" in caplog.text


def test_symm_mem_is_refused_where_torch_has_neither_its_method_nor_the_hook(prepared, monkeypatch):
    """torch 2.11 (the GPUs') has the custom all-gather hook and symmetric memory pools but not
    set_symm_mem_for_comm: the lab installs the same all-gather through the hook there."""
    import torch.distributed._symmetric_memory as symm_mem

    monkeypatch.delattr(FSDPModule, "set_symm_mem_for_comm", raising=False)  # torch 2.11 has none
    prepared(*TINY, "fsdp.symm_mem=true")  # the hook remains: accepted
    monkeypatch.delattr(symm_mem, "get_mem_pool")
    with pytest.raises(ConfigError, match=r"^fsdp\.symm_mem=true: torch .* lacks FSDPModule\.set_symm_mem_for_comm"):
        prepared(*TINY, "fsdp.symm_mem=true")


def test_symm_mem_reduce_scatters_need_the_reduce_scatter_hook_and_sums_need_torchs_switch(prepared, monkeypatch):
    """fsdp.force_sum_reduction=true beside fsdp.symm_mem=true takes the reduce-scatters into symmetric
    memory too: on a torch without set_symm_mem_for_comm that needs the custom reduce-scatter hook."""
    monkeypatch.delattr(FSDPModule, "set_symm_mem_for_comm", raising=False)  # torch 2.11 has none
    monkeypatch.delattr(FSDPModule, "set_custom_reduce_scatter")
    prepared(*TINY, "fsdp.symm_mem=true")  # all-gathers alone need only the all-gather hook
    with pytest.raises(ConfigError, match=r"^fsdp\.symm_mem=true: torch .* lacks .*set_custom_reduce_scatter"):
        prepared(*TINY, "fsdp.symm_mem=true", "fsdp.force_sum_reduction=true")
    monkeypatch.delattr(FSDPModule, "set_force_sum_reduction_for_comms")
    with pytest.raises(ConfigError, match=r"^fsdp\.force_sum_reduction=true: torch .* lacks FSDPModule\.set_force_sum_reduction_for_comms"):
        prepared(*TINY, "fsdp.force_sum_reduction=true")


@pytest.mark.parametrize("enabled", [True, False])
def test_force_sum_reduction_reaches_every_unit_and_the_root(on_one_rank, enabled):
    """Each FSDP unit reduces on its own: the switch must be set on the blocks' units and the root's."""
    _, model = on_one_rank(f"fsdp.force_sum_reduction={str(enabled).lower()}")
    groups = [g for m in model.modules() if isinstance(m, FSDPModule) for g in param_groups(m._get_fsdp_state())]
    assert len(groups) > 1 and [g.force_sum_reduction_for_comms for g in groups] == [enabled] * len(groups)


def test_blocks_fed_in_param_dtype_train_the_same_without_casting_their_inputs(on_one_rank):
    """The embedding's unit computes in bfloat16, so every block's input already is: the cast each
    block's unit makes is a no-op, and leaving it out changes no number."""
    casting = loss_and_grad_norm(*on_one_rank("fsdp.param_dtype=bfloat16"))
    assert loss_and_grad_norm(*on_one_rank("fsdp.param_dtype=bfloat16", "fsdp.cast_forward_inputs=false")) == casting


@pytest.mark.parametrize("engine", ["fsdp2", "fsdp1"])
def test_q_and_k_as_their_own_units_train_as_within_a_block(on_one_rank, engine):
    """The attention projects q and k in one matmul only where their linears are plain: as FSDP
    units of their own (wrap=linear) each is called, its weight gathered, and the rotary tables
    sized for q's heads alone."""
    blocks = loss_and_grad_norm(*on_one_rank(f"mesh.engine={engine}"))
    linears = loss_and_grad_norm(*on_one_rank(f"mesh.engine={engine}", "wrap=linear"))
    assert linears == pytest.approx(blocks, rel=1e-5)


@pytest.mark.parametrize("engine", ["fsdp2", "fsdp1"])
def test_q_and_k_as_their_own_units_run_sharded_over_two_ranks(built, engine):
    run, _, model = built(f"mesh.engine={engine}", "wrap=linear")
    (inputs, targets), = batch(run, model)
    loss_fn(model(inputs), targets).backward()  # each gathers its own weight: no shape left unsharded
