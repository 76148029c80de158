"""float8 training (torchao, emulated on this CPU as CI runs it): the linears convert before TP and
FSDP and start from the weights the high-precision reference starts from; FSDP2 (with float8
all-gather) and FSDP2 x TP runs drift from the DDP reference within float8.parity_tolerance, and
visibly more than fp32 does; every shape or combination torchao cannot take is refused in one line."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

from fsdp_lab.config import Float8Config
from fsdp_lab.models.transformer import TransformerConfig
from fsdp_lab.estimate import estimate
from fsdp_lab.models import build_meta, build_model, materializer, transformer_spec
from fsdp_lab.parallel.float8 import apply_float8, converted_block_share, float8_plan
from torchao.float8.float8_linear import Float8Linear
from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput
from in_process import run_lab_here
from test_bad_input import assert_refused_before_any_rank_starts
from warm_lab import run_lab_warm

TINY = TransformerConfig(dim=16, n_layers=2, n_heads=2, ffn_dim=32, vocab_size=32)
RUN = ("debug=cpu_tiny", "model.n_heads=2", "model.vocab_size=32", "optim=sgd", "optim.lr=0.1", "train.steps=3")


def test_converted_linears_start_from_the_reference_weights():
    reference = build_model(TINY, seed=3)
    model = build_meta(TINY)
    init = materializer(model, TINY, 3)
    apply_float8(model, Float8Config(recipe="tensorwise"), torch.device("cpu"))
    init.materialise(model, torch.device("cpu"))
    converted = [n for n, m in model.named_modules() if isinstance(m, Float8Linear)]
    assert len(converted) == 7 * TINY.n_layers and "output" not in converted, "every block linear but the skipped output"
    for (name, p), (ref_name, ref) in zip(model.named_parameters(), reference.named_parameters()):
        assert name == ref_name and torch.equal(p, ref), name


def test_float8_skip_keeps_named_linears_in_high_precision():
    model = build_meta(TINY)
    apply_float8(model, Float8Config(recipe="rowwise", skip=["output", "w2", "layers.1"]), torch.device("cpu"))
    kept = {n for n, m in model.named_modules() if type(m) is nn.Linear}
    assert kept == {"output", "layers.0.feed_forward.w2"} | {n for n, m in model.layers[1].named_modules(prefix="layers.1") if isinstance(m, nn.Linear)}


def test_the_plan_prices_the_converted_share_of_the_blocks_matmuls():
    """The plan prices float8 by the share of the blocks' linear weights converted (so of their matmul
    FLOPs): all of them by default (the output projection is outside the blocks), less what float8.skip keeps."""
    model = build_meta(TINY)
    assert converted_block_share(model, Float8Config(recipe="none")) == 0.0
    assert converted_block_share(model, Float8Config(recipe="tensorwise")) == 1.0
    linears = {n: m.weight.numel() for n, m in model.layers.named_modules() if type(m) is nn.Linear}
    w2 = sum(v for n, v in linears.items() if n.endswith("w2"))
    assert converted_block_share(model, Float8Config(recipe="tensorwise", skip=["w2"])) == pytest.approx(1 - w2 / sum(linears.values()))


# Two blocks of Llama-3-8B's width at seq 4096, where float8 pays (traced on fake tensors: no FLOPs run).
WIDE = ("+experiment=bench_llama1b_compiled", "model.dim=4096", "model.n_layers=2", "model.n_heads=32", "model.ffn_dim=14336",
        "model.vocab_size=8192", "train.seq_len=4096", "train.batch_size=1", "probes.parity.enabled=false")


def matmul_flops(trace, phase: str) -> int:
    return sum(2 * math.prod(o.dims) for o in trace.ops if o.kind == "mm" and o.phase == phase)


def test_the_plans_trace_holds_float8_matmuls_and_each_cast_eager_and_fused():
    """torchao runs a float8 matmul inside its tensor subclass, out of the trace's sight: the trace
    records it from its operands, so the float8 blocks' matmul FLOPs are the bf16 blocks'. Each cast
    (an input, a weight, a gradient) is one op of the bytes compiled kernels move, beside its eager
    chain of ops; a compiled float8 layout is priced below bf16's on the H100 table."""
    from fsdp_lab.plan.predict import predict_overrides, run_of
    from fsdp_lab.plan.cost import price
    from fsdp_lab.plan.device import load_device
    from fsdp_lab.plan.trace import FLOAT8_CAST, FLOAT8_WEIGHT_CAST, Trace, trace_step

    bf16, float8 = (trace_step(run_of([*WIDE, *extra]), layers=2, batch=1, ac="none") for extra in ([], ["float8.recipe=tensorwise"]))
    for phase in ("fwd", "bwd"):
        assert matmul_flops(float8, phase) == matmul_flops(bf16, phase) > 0, phase
        casts = [o for o in float8.ops if o.kind == "cast" and o.phase == phase]
        chains = [o for o in float8.ops if o.name.startswith(FLOAT8_CAST + ".") and o.phase == phase]
        assert casts and len(chains) > 3 * len(casts), phase  # amax, scale, scaled copy: several eager ops each
    assert not any(o.kind == "cast" or o.name.startswith(FLOAT8_CAST) for o in bf16.ops)
    # A weight's cast is named as such (forward, and torchao's again in backward): 7 linears in each of 2 blocks.
    assert [sum(o.name == FLOAT8_WEIGHT_CAST for o in float8.ops if o.kind == "cast" and o.phase == ph) for ph in ("fwd", "bwd")] == [14, 14]
    # Under TP a rank casts its shard of each weight; the activations' casts are priced whole.
    h100 = load_device("h100-80gb")
    weights_only = Trace([o for o in float8.ops if o.kind != "cast" or o.name == FLOAT8_WEIGHT_CAST], float8.host_ops, float8.peak_bytes)
    others = Trace([o for o in float8.ops if o.kind != "cast" or o.name != FLOAT8_WEIGHT_CAST], float8.host_ops, float8.peak_bytes)
    for phase in ("fwd", "bwd"):
        cast = {(name, tp): price(t, t, 1, tp, h100)[phase].cast_compiled for name, t in (("weights", weights_only), ("others", others)) for tp in (1, 2)}
        assert cast["weights", 2] == pytest.approx(cast["weights", 1] / 2) and cast["weights", 1] > 0
        assert cast["others", 2] == cast["others", 1] > 0
    predicted = {f8: predict_overrides([*WIDE, f"float8.recipe={f8}", "mesh.dp_shard=4"], world_size=4, device="h100-80gb", gpus_per_node=4)
                 for f8 in ("none", "tensorwise")}
    assert predicted["tensorwise"]["gpu_s"] < predicted["none"]["gpu_s"]


def test_tensorwise_tp_plan_swaps_converted_linears_for_torchaos_float8_styles_keeping_layouts():
    block = build_meta(TINY).layers[0]
    apply_float8(block, Float8Config(recipe="tensorwise", skip=["wv"]), torch.device("cpu"))
    plan = {"attention.wq": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1))}
    styles = float8_plan(block, plan, Float8Config(recipe="tensorwise"))
    assert type(styles["attention.wq"]) is Float8ColwiseParallel
    assert styles["attention.wv"] is plan["attention.wv"], "a linear left in high precision keeps PyTorch's style"
    assert type(styles["attention.wo"]) is Float8RowwiseParallel and styles["attention.wo"].output_layouts == (Shard(1),)
    assert styles["attention.wo"].input_layouts == (Shard(-1),) and plan["attention.wq"].output_layouts == (Shard(-1),)
    assert float8_plan(block, plan, Float8Config(recipe="rowwise")) is plan, "rowwise keeps PyTorch's styles, as torchtitan"


def test_a_module_feeding_only_converted_column_wise_linears_casts_its_input_to_float8_once():
    block = build_meta(TINY).layers[0]
    apply_float8(block, Float8Config(recipe="tensorwise", skip=["wv"]), torch.device("cpu"))
    plan = transformer_spec.tp_plan(TINY, sequence_parallel=True)[1]
    styles = float8_plan(block, plan, Float8Config(recipe="tensorwise"))
    assert type(styles["attention"]) is PrepareModuleInput
    assert type(styles["feed_forward"]) is PrepareFloat8ModuleInput
    assert styles["feed_forward"].input_layouts == (Shard(1),) and styles["feed_forward"].desired_input_layouts == (Replicate(),)
    assert styles["attention"] is plan["attention"], "wv stays in high precision: a float8 input would reach it"
    assert float8_plan(block, {"feed_forward": plan["feed_forward"], "feed_forward.w2": plan["feed_forward.w2"]},
                       Float8Config(recipe="tensorwise"))["feed_forward"] is plan["feed_forward"], "no column-wise linear to feed"


def test_the_estimate_traces_the_float8_model(prepared):
    """mode=estimate runs the conversion under its fake tensors: the converted linears' casts show in
    the traced activations (on this CPU torchao's emulated path: see docs/float8.md)."""
    shape = ("mode=estimate", "debug=cpu_tiny", "mesh.dp_shard=2", "model.n_heads=2", "train.seq_len=16", "fsdp.param_dtype=bfloat16")
    plain = estimate(*prepared(*shape))
    float8 = estimate(*prepared(*shape, "float8.recipe=tensorwise", "float8.fsdp_all_gather=true"))
    assert float8["model"] == plain["model"], "the same parameters"
    assert float8["traced_peak_mib"] != plain["traced_peak_mib"] and float8["phases_mib"]["after_bwd"] > 0


REFUSALS = [
    ("float8.fsdp_all_gather=true",
     "float8.fsdp_all_gather=true with float8.recipe=none: there are no float8 weights to gather; allowed: float8.recipe=tensorwise"),
    ("float8.recipe=rowwise float8.fsdp_all_gather=true",
     "float8.fsdp_all_gather=true with float8.recipe=rowwise: only one scale per tensor can be gathered with its shards; allowed: float8.recipe=tensorwise"),
    ("float8.recipe=tensorwise mesh.engine=fsdp1",
     "float8.recipe=tensorwise with mesh.engine=fsdp1: torchao's float8 training composes with fully_shard and DDP; allowed: mesh.engine=fsdp2|ddp"),
    ("float8.recipe=tensorwise float8.fsdp_all_gather=true mesh=ddp",
     "float8.fsdp_all_gather=true with mesh.engine=ddp: only FSDP2 all-gathers weights; allowed: mesh.engine=fsdp2"),
    ("float8.recipe=tensorwise model.dim=24",
     "float8.recipe=tensorwise: linear layers.0.attention.wq is 24 -> 24 per rank (mesh.tp=1); float8 matmuls need both multiples of 16"),
    ("float8.recipe=rowwise mesh=tp2d",
     "float8.recipe=rowwise: linear layers.0.attention.wq is 16 -> 8 per rank (mesh.tp=2); float8 matmuls need both multiples of 16"),
    ("float8.recipe=tensorwise mesh=tp2d model.dim=32 model.ffn_dim=33",  # 17 + 16 over the tp ranks: the first does not fit
     "float8.recipe=tensorwise: linear layers.0.feed_forward.w1 is 32 -> 17 per rank (mesh.tp=2); float8 matmuls need both multiples of 16"),
    ("float8.recipe=tensorwise float8.fsdp_all_gather=true mesh.dp_shard=3 model.dim=32 model.ffn_dim=32",
     "float8.fsdp_all_gather=true: linear layers.0.attention.wq's weight has 32 rows per tp rank, which do not split over mesh.dp_shard=3 ranks"),
    ("float8.recipe=tensorwise model.compile=true",
     "model.compile=true with float8.recipe=tensorwise on a device without float8 matmuls (CPU, GPUs before SM 8.9): torchao's emulation cannot be compiled"),
    ("float8.recipe=tensorwise mesh=tp2d mesh.sequence_parallel=true model.dim=32 model.ffn_dim=64",
     "mesh.sequence_parallel=true with float8.recipe=tensorwise and mesh.tp>1 on CPU: torchao's float8 TP styles all-gather float8 tensors, which gloo cannot"),
    ("float8.recipe=tensorwise float8.skip=[layers,output]",
     "float8.recipe=tensorwise: no nn.Linear of model.name=transformer is left to convert"),
    ("float8.recipe=bf8", "float8.recipe=bf8: allowed are none, tensorwise, rowwise"),
    ("float8.recipe=rowwise float8.tp_scales=shard",
     "float8.tp_scales=shard with float8.recipe=rowwise: only tensorwise scales span a whole tensor; allowed: float8.tp_scales=tensor"),
    ("float8.recipe=tensorwise float8.tp_scales=row", "float8.tp_scales=row: allowed are tensor, shard"),
    ("float8.tp_scales=shard", "float8.tp_scales=shard with float8.recipe=none: there are no float8 casts to scale; allowed: float8.recipe=tensorwise"),
]


@pytest.mark.bad_input
@pytest.mark.parametrize("overrides,message", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_what_float8_cannot_do_is_refused_in_one_line(prepared, overrides, message):
    with pytest.raises(ValueError) as refused:
        prepared("debug=cpu_tiny", *overrides.split())
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.bad_input
def test_the_cli_refuses_before_any_rank_starts_and_leaves_no_run_dir(tmp_path):
    overrides = "debug=cpu_tiny float8.recipe=rowwise float8.fsdp_all_gather=true"
    result = run_lab_here(*overrides.split(), run_dir=tmp_path / "run", as_rank=False)
    assert_refused_before_any_rank_starts(result, "error: " + dict(REFUSALS)["float8.recipe=rowwise float8.fsdp_all_gather=true"], tmp_path / "run")


def assert_float8_drift(result, world_size: int) -> dict:
    """A float8 run ended ok, its parity a drift from the fp32 reference within float8.parity_tolerance:
    larger than fp32's own tolerance (the linears did compute in float8), smaller than the stated one."""
    assert result.returncode == 0, result.stderr[-3000:]
    s = result.summary
    assert (s["status"], s["world_size"], s["steps"]) == ("ok", world_size, 3)
    p = s["parity"]
    assert p["ok"] and p["tolerance"] == Float8Config().parity_tolerance and p["reference"] == "ddp-fp32", p
    assert 1e-5 < p["max_loss_abs_diff"] <= p["tolerance"], p
    assert s["memory"]["phases_mib"]["after_bwd"] > 0, "memory per phase follows float8 runs"
    return s


@pytest.mark.slow
def test_fsdp2_with_float8_all_gather_drifts_within_its_tolerance(tmp_path):
    result = run_lab_warm(*RUN, "float8.recipe=tensorwise", "float8.fsdp_all_gather=true", run_dir=tmp_path / "run")
    assert_float8_drift(result, 2)
    out = result.stdout + result.stderr
    assert "float8: tensorwise, 14 linears converted, fsdp_all_gather=true, tp_scales=tensor, emulated" in out
    assert "float8: weight scales precomputed after every optimizer.step" in out


@pytest.mark.slow
def test_fsdp2_x_tp_with_float8_tp_styles_drifts_within_its_tolerance(tmp_path):
    result = run_lab_warm(*RUN, "mesh=tp2d", "model.dim=32", "model.ffn_dim=64", "float8.recipe=tensorwise",
                          "float8.fsdp_all_gather=true", run_dir=tmp_path / "run")
    s = assert_float8_drift(result, 4)
    assert {k: s["mesh"][k] for k in ("dp_shard", "tp")} == {"dp_shard": 2, "tp": 2}


@pytest.mark.slow
def test_fsdp2_x_tp_with_shard_scales_drifts_as_little_as_torchaos_tensor_scales(tmp_path):
    """float8.tp_scales=shard: each rank casts its own shards. Here torchao's tensor scales drift 6.0e-4 in
    the parameters and 8.2e-4 in the gradient norm, shard scales 6.7e-4 and 6.6e-4; leaving the column-wise
    layers' input gradients unsummed over the TP ranks drifts 2.6e-3 and 4.9e-3, which float8's parity
    tolerance alone would pass."""
    result = run_lab_warm(*RUN, "mesh=tp2d", "model.dim=32", "model.ffn_dim=64", "float8.recipe=tensorwise",
                          "float8.fsdp_all_gather=true", "float8.tp_scales=shard", run_dir=tmp_path / "run")
    p = assert_float8_drift(result, 4)["parity"]
    assert p["max_param_abs_diff"] < 1.5e-3 and p["max_grad_norm_abs_diff"] < 2e-3, p
