"""Memory science: the module-wise breakdown of real runs on CPU/gloo, and estimates of worlds this
machine does not have (one process, a fake process group, fake tensors)."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.optim.optimizer import _default_to_fused_or_foreach

from fsdp_lab import compose
from autograd_saved import saved_by
from fsdp_lab.config import ConfigError, OptimConfig
from fsdp_lab.estimate import estimate
from fsdp_lab.estimate.cuda_kernels import SUBSTITUTED, cuda_kernels
from fsdp_lab.estimate.pipeline import schedule_order
from fsdp_lab.optim import build_optimizer
from fsdp_lab.memory_phases import PHASES
from fsdp_lab.probes.memory_breakdown import BREAKDOWN_JSON, BREAKDOWN_TABLE
from in_process import run_lab_here
from warm_lab import run_lab_warm
from wandb_records import OfflineRun

TRACKED = ("train.steps=2", "probes.memory.tracker=module", "probes.parity.enabled=false")
FSDP_UNITS = {"FSDPTransformer", "FSDPTransformer.layers.0", "FSDPTransformer.layers.1"}


@functools.cache
def estimated(*overrides: str) -> dict:
    """Read-only: tests share the estimates of equal configurations."""
    return estimate(*compose.prepared("mode=estimate", *overrides))


def assert_sums_to_total(categories: dict, total: float, where: str) -> None:
    assert sum(categories.values()) == pytest.approx(total, rel=1e-9), f"{where}: categories do not sum to the peak"


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """The same model tracked at step 2 on 2 ranks (with W&B offline) and on 4 ranks."""
    runs = {}
    for world, logger in ((2, "logger=wandb"), (4, "logger=none")):
        result = run_lab_warm(*TRACKED, f"mesh.world_size={world}", logger, run_dir=tmp_path_factory.mktemp(f"w{world}") / "run")
        assert result.returncode == 0, result.stderr[-3000:]
        runs[world] = result
    return runs


def breakdown(run) -> dict:
    return json.loads((run.run_dir / BREAKDOWN_JSON).read_text())


@pytest.mark.slow
def test_breakdown_has_every_fsdp_unit_in_both_passes_and_its_categories_sum_to_the_peak(tracked):
    report = breakdown(tracked[2])
    assert (report["tracker"], report["step"], report["device"]) == ("FSDPMemTracker", 2, "cpu")
    assert {m["module"] for m in report["modules"]} == FSDP_UNITS
    assert_sums_to_total(report["peak_categories_mib"], report["peak_mib"], "step peak")
    for module in report["modules"]:
        for phase in ("forward", "backward"):
            assert_sums_to_total(module[phase]["categories_mib"], module[phase]["peak_mib"], f"{module['module']} {phase}")
            assert module[phase]["peak_mib"] <= report["peak_mib"] + 1e-9
    root = next(m for m in report["modules"] if m["module"] == "FSDPTransformer")
    assert root["forward"]["categories_mib"]["Activation"] > 0, "forward holds activations"
    assert root["backward"]["categories_mib"]["OptState"] > 0, "the warm-up step created optimizer state"
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert report["ranks"][0]["peak_mib"] == pytest.approx(report["ranks"][1]["peak_mib"]), "even shards, even peaks"
    assert report["tracker_accuracy"] is None and report["allocator_peak_mib"] is None, "no allocator on CPU"
    table = (tracked[2].run_dir / BREAKDOWN_TABLE).read_text()
    assert "| FSDPTransformer.layers.1 | backward |" in table and "Sharded Param" in table


@pytest.mark.slow
def test_tracked_step_reports_the_tracker_in_metrics_summary_and_wandb(tracked):
    run = tracked[2]
    report = breakdown(run)
    step2 = run.metrics[1]
    assert "memory/tracker_accuracy" in step2 and step2["memory/tracker_accuracy"] is None
    assert "memory/tracker_accuracy" not in run.metrics[0]
    # On CPU the tracked step's phases are read from the module tracker: one count, one peak.
    assert step2["memory/peak_mib"] == pytest.approx(report["peak_mib"])
    memory = run.summary["memory"]
    assert memory["tracker_peak_mib"] == pytest.approx(report["peak_mib"])
    assert set(memory["phases_max_mib"]) == set(PHASES)
    assert memory["phases_max_mib"]["after_fwd"] >= memory["phases_mib"]["after_fwd"]
    # W&B records a table as nested keys under its name.
    table = OfflineRun.in_run_dir(run.run_dir).summary["tables/memory_breakdown"]
    assert table["_type"] == "table-file" and table["nrows"] == 2 * len(FSDP_UNITS) + 1


@pytest.mark.slow
def test_sharded_parameter_and_optimizer_memory_halve_from_2_to_4_ranks(tracked):
    two, four = breakdown(tracked[2])["peak_categories_mib"], breakdown(tracked[4])["peak_categories_mib"]
    assert four["Sharded Param"] == pytest.approx(two["Sharded Param"] / 2, rel=1e-3)
    assert four["OptState"] == pytest.approx(two["OptState"] / 2, rel=1e-2)  # + Adam's per-parameter step scalars
    assert len(breakdown(tracked[4])["ranks"]) == 4


@pytest.mark.slow
def test_estimate_on_a_fake_group_predicts_the_tracked_run(tracked):
    """The CPU run keeps what the CPU kernels save; the estimate, what CUDA's save (less, for the
    transformer's RMSNorm and attention): the rest is the same."""
    real = breakdown(tracked[2])
    predicted = estimated("mesh.dp_shard=2")
    assert predicted["peak_mib"] == pytest.approx(predicted["traced_peak_mib"] + predicted["assumptions"]["workspace_mib"])
    for category in ("Sharded Param", "Unsharded Param", "OptState"):
        assert predicted["peak_categories_mib"][category] == pytest.approx(real["peak_categories_mib"][category], rel=0.01)
    assert predicted["traced_peak_mib"] < real["peak_mib"]
    tracked_phases = {p: tracked[2].metrics[1][f"memory/{p}_mib"] for p in PHASES}
    for phase in ("start", "done"):  # no activations alive
        assert predicted["phases_mib"][phase] == pytest.approx(tracked_phases[phase], rel=0.01)


def test_estimate_steps_with_single_tensor_adam_on_its_cpu_device():
    """The estimate builds the optimizer for its fake CPU device, where it is neither fused nor foreach
    (its single-tensor step is then replaced by fused Adam's in-place update): fused Adam over fake
    DTensors gathers full tensors on torch 2.11 (5x the state, measured on GPU). An explicit
    optim.foreach=true is estimated as configured."""
    params = [torch.nn.Parameter(torch.zeros(4))]
    default = build_optimizer(params, OptimConfig(), torch.device("cpu"))
    assert not default.defaults["fused"] and default.defaults["foreach"] is None
    assert _default_to_fused_or_foreach(params, differentiable=False, use_fused=False) == (False, False)
    assert build_optimizer(params, OptimConfig(foreach=True), torch.device("cpu")).defaults["foreach"] is True


def test_estimate_shrinks_parameter_and_optimizer_memory_4x_from_2_to_8_ranks():
    two, eight = (estimated(f"mesh.dp_shard={n}")["peak_categories_mib"] for n in (2, 8))
    state = lambda c: c["Sharded Param"] + c["OptState"]  # noqa: E731
    assert state(two) / state(eight) == pytest.approx(4, rel=0.03)
    assert eight["Activation"] == pytest.approx(two["Activation"], rel=0.01), "the per-rank batch is the same"


def test_estimated_phases_follow_the_physics_of_a_step():
    small, large = (estimated("mesh.dp_shard=2", *([f"train.batch_size={b}"] if b != 4 else [])) for b in (4, 8))
    forward = lambda e: e["phases_mib"]["after_fwd"] - e["phases_mib"]["start"]  # noqa: E731
    assert forward(small) > 0 and forward(large) == pytest.approx(2 * forward(small), rel=0.05), "activations scale with the batch"
    cats = small["peak_categories_mib"]
    assert cats["OptState"] == pytest.approx(2 * cats["Sharded Param"], rel=0.02), "Adam keeps two moments per parameter"
    assert small["phases_mib"]["done"] < small["phases_mib"]["after_step"], "zero_grad frees the gradients"


def test_estimate_of_hsdp_shards_within_the_replica():
    hsdp = estimated("mesh.dp_replicate=2", "mesh.dp_shard=2")
    fsdp = estimated("mesh.dp_shard=2")
    assert hsdp["world_size"] == 4 and hsdp["mesh"]["dp_replicate"] == 2
    assert hsdp["peak_categories_mib"]["Sharded Param"] == pytest.approx(fsdp["peak_categories_mib"]["Sharded Param"])


def test_estimate_cli_prints_the_prediction_and_writes_estimate_json(tmp_path):
    # The estimate runs in the CLI's own process (no rank starts): worked here.
    result = run_lab_here("mode=estimate", "mesh.dp_shard=64", "model.dim=256", "logger=none", run_dir=tmp_path / "run", as_rank=False)
    assert result.returncode == 0, result.stderr[-3000:]
    written = json.loads((result.run_dir / "estimate.json").read_text())
    assert (written["world_size"], written["mesh"]["dp_shard"], written["tracker"]) == (64, 64, "FSDPMemTracker")
    assert f"estimate: peak {written['peak_mib']:.1f} MiB per rank" in result.stdout
    assert "estimate: no device to fit on (no GPU visible)" in result.stdout
    assert "| FSDPTransformer.layers.0 | forward |" in result.stdout
    assert result.summary["status"] == "ok" and result.summary["memory"]["peak_mib"] == written["peak_mib"]


def test_estimate_of_tensor_parallelism_runs_on_a_fake_group_and_shards_parameters_over_tp():
    dp, tp2d = estimated("mesh.dp_shard=2"), estimated("mesh.dp_shard=2", "mesh.tp=2")
    assert (tp2d["world_size"], tp2d["mesh"]["tp"]) == (4, 2)
    state = lambda e: e["peak_categories_mib"]["Sharded Param"] + e["peak_categories_mib"]["OptState"]  # noqa: E731
    assert state(dp) / state(tp2d) == pytest.approx(2, rel=0.05)
    sp = estimated("mesh.dp_shard=2", "mesh.tp=2", "mesh.sequence_parallel=true")
    assert sp["peak_categories_mib"]["Activation"] < tp2d["peak_categories_mib"]["Activation"], "norms hold 1/tp of the sequence"


PIPELINE = ("mesh.pp=2", "mesh.dp_shard=2", "train.batch_size=8", "train.microbatches=4", "model.n_layers=4")


def test_schedule_order_keeps_pp_minus_stage_microbatches_in_flight_under_1f1b_and_all_under_gpipe():
    def most_in_flight(order):
        held = peak = 0
        for action, _ in order:
            held += 1 if action == "F" else -1
            peak = max(peak, held)
        return peak

    for stage in range(4):
        order = schedule_order("1f1b", 8, 4, stage)
        assert sorted(order) == sorted([("F", i) for i in range(8)] + [("B", i) for i in range(8)])
        assert order.index(("B", 0)) == 4 - stage and most_in_flight(order) == 4 - stage
        assert most_in_flight(schedule_order("gpipe", 8, 4, stage)) == 8


@pytest.mark.slow  # tens of CPU seconds in process
def test_estimate_of_a_pipeline_is_per_pp_rank_and_the_first_stage_holds_most_under_1f1b():
    """On a fake group, in process. The stages are equal (4 layers, untied embeddings and output of one
    size); under 1f1b the first stage holds pp = 2 microbatches in flight, the last 1; under gpipe both
    hold all 4, so the first stage's activations double."""
    one_f_one_b, gpipe = (estimated(*PIPELINE, f"mesh.pp_schedule={s}") for s in ("1f1b", "gpipe"))
    first, last = one_f_one_b["pp_ranks"]
    assert (first["pp_rank"], first["rank"], last["pp_rank"], last["rank"]) == (0, 0, 1, 2)
    assert first["peak_mib"] > last["peak_mib"] and one_f_one_b["peak_mib"] == first["peak_mib"]
    activation = lambda e: e["peak_categories_mib"]["Activation"]  # noqa: E731
    first_gpipe = estimated(*PIPELINE, "mesh.pp_schedule=gpipe", "model.vocab_size=8")  # the last stage's logits out of the way
    first_1f1b = estimated(*PIPELINE, "mesh.pp_schedule=1f1b", "model.vocab_size=8")
    assert activation(first_gpipe) / activation(first_1f1b) == pytest.approx(2, rel=0.15)
    assert gpipe["peak_mib"] > one_f_one_b["peak_mib"]
    whole = estimated("mesh.dp_shard=2", "model.n_layers=4", "train.batch_size=8", "train.microbatches=4")
    state = lambda e: e["peak_categories_mib"]["Sharded Param"] + e["peak_categories_mib"]["OptState"]  # noqa: E731
    assert state(whole) / state(one_f_one_b) == pytest.approx(2, rel=0.2), "each stage holds half the parameters"


def test_estimate_states_its_assumptions_and_whether_it_fits():
    small = estimated("mesh.dp_shard=2", "estimate.device_memory_gib=0.5")
    a = small["assumptions"]
    assert set(a["kernels_substituted"]) == set(SUBSTITUTED) and a["reserved_mib"] == 1024 and a["fragmentation"] == 0.05
    assert small["needed_mib"] == pytest.approx(small["peak_mib"] * 1.05 + 1024)
    assert (small["device"], small["fits"]) == ("estimate.device_memory_gib", False)
    h200 = estimated("mesh.dp_shard=2", "estimate.device=h200")
    assert (h200["device"], h200["device_memory_mib"], h200["fits"]) == ("h200", 139.8 * 1024, True)


def test_cuda_kernels_save_what_cuda_saves_and_only_inside_the_estimate():
    """Fused RMSNorm keeps the input and an fp32 rstd per row (checked on an H200: FusedRmsNormBackward0);
    bf16 attention is cuDNN's, whose output follows the query's layout, fp32 attention the
    memory-efficient kernel's, stored (batch, seq, heads, dim) (checked on an H200 with
    benchmarks/saved_tensors.py). Outside, the real modules run (and compute)."""
    original = (torch.nn.RMSNorm.forward, torch.nn.functional.scaled_dot_product_attention)
    with FakeTensorMode():
        x = torch.randn(2, 8, 16, dtype=torch.bfloat16, requires_grad=True)
        norm = torch.nn.RMSNorm(16, dtype=torch.bfloat16)
        q = torch.randn(2, 8, 4, 4, dtype=torch.bfloat16, requires_grad=True).transpose(1, 2)
        attention = lambda t: torch.nn.functional.scaled_dot_product_attention(t, t, t, is_causal=True)  # noqa: E731
        cudnn_layouts = {}
        with cuda_kernels():
            norm_saved, norm_out = saved_by(norm, x)
            attn_saved, attn_out = saved_by(attention, q)  # head size 4: not cuDNN's
            for dtype in (torch.bfloat16, torch.float32):
                contiguous = torch.randn(2, 4, 8, 8, dtype=dtype, requires_grad=True)  # as rotary embeddings leave q
                saved, out = saved_by(attention, contiguous)
                cudnn_layouts[dtype] = (out.is_contiguous(), saved[3])
        cpu_saved, _ = saved_by(norm, x)
    assert sorted(norm_saved, key=str) == sorted([((2, 8, 16), torch.bfloat16), ((16,), torch.bfloat16), ((2, 8, 1), torch.float32)], key=str)
    assert len(cpu_saved) > len(norm_saved), "the CPU composite saves more"
    assert attn_out.transpose(1, 2).is_contiguous() and ((2, 4, 32), torch.float32) in attn_saved, "logsumexp rows rounded up to 32"
    assert cudnn_layouts == {
        torch.bfloat16: (True, ((2, 4, 8, 1), torch.float32)),  # cuDNN: the query's layout; the reshape copies
        torch.float32: (False, ((2, 4, 32), torch.float32)),  # memory-efficient: (batch, seq, heads, dim)
    }
    assert (torch.nn.RMSNorm.forward, torch.nn.functional.scaled_dot_product_attention) == original
    estimated("mesh.dp_shard=2")
    assert (torch.nn.RMSNorm.forward, torch.nn.functional.scaled_dot_product_attention) == original
    real = torch.nn.RMSNorm(4)(torch.tensor([[3.0, 4.0, 0.0, 0.0]]))
    assert torch.allclose(real, torch.tensor([[1.2, 1.6, 0.0, 0.0]]), atol=1e-4)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["mesh.pp=2", "mesh.dp_shard=2", "mesh.tp=2", "mesh.sequence_parallel=true", "train.microbatches=2"],
         "mesh.sequence_parallel=true: mode=estimate cannot predict this; allowed with mesh.pp>1: false"),
        (["fsdp.cpu_offload=true", "mesh.world_size=2"], "fsdp.cpu_offload=true: mode=estimate cannot predict this"),
        (["model.compile=true", "mesh.world_size=2"], "model.compile=true: mode=estimate cannot predict this"),
    ],
)
def test_estimate_refuses_what_it_cannot_predict(prepared, overrides, message):
    """The rest of the refusals, and the one-line CLI form, are in test_bad_input's catalogue."""
    with pytest.raises(ConfigError, match=message):
        prepared("mode=estimate", *overrides)


def test_estimate_world_size_comes_from_the_degrees_not_the_devices(prepared):
    run, dims = prepared("mode=estimate", "mesh.dp_replicate=4", "mesh.dp_shard=32")
    assert dims.world_size == 128


def test_tracker_step_must_exist(prepared):
    with pytest.raises(ConfigError, match="probes.memory.tracker_step=3: must be in 2..train.steps=2"):
        prepared("probes.memory.tracker=module", "probes.memory.tracker_step=3", "train.steps=2")
