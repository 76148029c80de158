"""benchmarks/kernel_time.py on a hand-made trace of two overlapping streams: busy time per kernel
class and in all, per step (over the `step N` spans, or the steps given where the trace names none);
the time a collective runs alone, in all and by its kind; the matmuls that overlap a
collective against those that do not; which of two ranks reached each collective later (on the
host's clock, each trace's own base added); and the CLI's block per rank and its refusal of a trace
without device kernels."""

from __future__ import annotations

import json
import math
import sys

import pytest

from benchmark_scripts import load, span


@pytest.fixture(scope="module")
def kernel_time():
    return load("kernel_time")


# Compute and NCCL overlapping in time, as on their own streams. Collectives 250-400 and 380-420 merge to 250-420, beside
# the gemm's 250-300 and the copy's 350-370: alone 300-350 and 370-420. The cuDNN attention kernel
# has `sm90_` in its name and the fused Adam `multi_tensor`: the class order must place them.
DEVICE = [
    span("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 100, 200),
    span("kernel", "ncclDevKernel_AllGather_RING_LL", 250, 150),
    span("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 350, 20),
    span("kernel", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", 380, 40),
    span("kernel", "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", 500, 100),
    span("kernel", "multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor<float, 4>>", 650, 50),
    span("kernel", "multi_tensor_apply_kernel<TensorListMetadata<2>, BinaryOpListAlphaFunctor<float>>", 700, 30),
    span("kernel", "vectorized_elementwise_kernel<4, FillFunctor<c10::BFloat16>>", 800, 40),
    span("kernel", "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", 850, 60),
    span("kernel", "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", 920, 60),
]
# Run after the host's last step span has ended, as a step's kernels do with steps overlapped: counted.
AFTER = span("kernel", "nvjet_tst_256x128_64x4_2x1_v_bz_TNN", 1100, 140)
STEPS = [span("user_annotation", "step 3", 0, 500), span("user_annotation", "step 4", 500, 500),
         span("user_annotation", "FSDP::pre_forward (layers.0)", 0, 2000)]  # not a step
TRACE = {"traceEvents": [*STEPS, span("cpu_op", "aten::mm", 90, 10), *DEVICE, AFTER]}


def test_device_time_per_step_by_class(kernel_time):
    events, steps = kernel_time.profiled(TRACE, unnamed_steps=5)
    assert steps == 2 and len(events) == len(DEVICE) + 1  # two step spans: unnamed_steps not used
    groups = kernel_time.by_class(events)
    assert kernel_time.time_by_class(groups, steps) == {
        "collective": 85, "matmul": 250, "attention": 30, "optimizer": 25, "multi-tensor": 15, "copy": 10,
        "other": 20, "busy": 400}  # busy: 100-420, 500-600, 650-730, 800-840, 850-910, 920-980, 1100-1240
    alone, by_kind = kernel_time.collective_alone(groups, steps)
    assert alone == 50
    # The all-gather alone 300-350 and 370-400, the reduce-scatter 380-420 (both at once 380-400).
    assert by_kind == {"AllGather": 40, "ReduceScatter": 20}
    # One all-gather (150 µs) and one reduce-scatter (40 µs) over two steps.
    assert kernel_time.collective_calls(groups, steps) == {"AllGather": (0.5, 150), "ReduceScatter": (0.5, 40)}


def test_matmuls_beside_a_collective_against_alone(kernel_time):
    # The sm90 gemm overlaps the all-gather; nvjet (twice) and ampere run alone: counts over both steps.
    groups = kernel_time.by_class(kernel_time.profiled(TRACE, 1)[0])
    assert kernel_time.matmuls_beside_collectives(groups) == (200, 1, 100, 3)
    beside, n_beside, alone, n_alone = kernel_time.matmuls_beside_collectives(kernel_time.by_class([DEVICE[4]]))
    assert math.isnan(beside) and (n_beside, alone, n_alone) == (0, 100, 1)
    # Of the matmuls' 500 µs (100-300, 500-600, 920-980, 1100-1240) the collectives (250-420) run beside 250-300.
    assert kernel_time.matmul_share_beside_collectives(groups) == pytest.approx(0.1)
    assert kernel_time.matmul_share_beside_collectives(kernel_time.by_class([DEVICE[4]])) == 0.0
    assert math.isnan(kernel_time.matmul_share_beside_collectives(kernel_time.by_class([DEVICE[1]])))


def test_a_trace_without_step_spans_is_divided_by_the_steps_given(kernel_time):
    events, steps = kernel_time.profiled({"traceEvents": [*DEVICE, AFTER]}, unnamed_steps=4)
    assert steps == 4 and kernel_time.time_by_class(kernel_time.by_class(events), steps)["busy"] == 200


def test_the_cli_prints_a_block_per_trace_and_refuses_one_without_device_kernels(kernel_time, tmp_path,
                                                                                 monkeypatch, capsys):
    rank0, cpu = tmp_path / "trace_rank0.json", tmp_path / "cpu.json"
    rank0.write_text(json.dumps(TRACE))
    cpu.write_text(json.dumps({"traceEvents": [*STEPS, span("cpu_op", "aten::mm", 90, 10)]}))
    monkeypatch.setattr(sys, "argv", ["kernel_time.py", str(rank0), str(cpu)])
    with pytest.raises(SystemExit) as exit:
        kernel_time.main()
    # A string exit code: Python prints it to stderr and exits 1.
    assert exit.value.code == f"{cpu}: no device kernels (a CPU run's trace has none)"
    out = capsys.readouterr().out
    assert f"{rank0}: 2 profiled steps" in out
    assert "collective alone (not hidden by compute): 0.050 ms/step (12.5% of busy)" in out
    assert "mean 200.0 µs (n=1) vs alone 100.0 µs (n=3), 2.00x; 10.0% of the matmuls' time beside one" in out


def rank_trace(base_us: int, collectives: list[tuple[str, float, float]]) -> dict:
    """A rank's trace whose `ts` count from its own base, as each process's trace does."""
    return {"baseTimeNanoseconds": base_us * 1000, "traceEvents": [
        span("kernel", name, start - base_us, end - start) for name, start, end in collectives]}


AG, RS = "ncclDevKernel_AllGather_RING_LL", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"
# On the host's clock: the all-gather ends at 1300 on both ranks, rank 1 having started it 250 µs
# later; the reduce-scatter ends at 5000 (5004 on rank 1: ends agree within the tolerance), rank 1
# started 40 µs earlier; rank 0's second all-gather (ending 9000) is outside rank 1's window.
RANK0 = rank_trace(1_000_000, [(AG, 1_001_000, 1_001_300), (RS, 1_004_800, 1_005_000), (AG, 1_008_900, 1_009_000)])
RANK1 = rank_trace(1_000_500, [(AG, 1_001_250, 1_001_300), (RS, 1_004_760, 1_005_004)])


def test_which_rank_reached_each_collective_later(kernel_time):
    def collectives(trace: dict) -> list[dict]:
        return kernel_time.by_class(kernel_time.profiled(trace, 1)[0])["collective"]

    clock0, clock1 = (kernel_time.collectives_on_the_clock(t, collectives(t)) for t in (RANK0, RANK1))
    assert sorted(kernel_time.arrival_lags(clock0, clock1)) == [-40, 250]
    # Compared without each trace's base, nothing would end together.
    assert kernel_time.arrival_lags(clock0, kernel_time.collectives_on_the_clock({}, collectives(RANK1))) == []


def test_the_cli_compares_each_rank_with_the_first(kernel_time, tmp_path, monkeypatch, capsys):
    paths = [tmp_path / "trace_rank0.json", tmp_path / "trace_rank1.json"]
    for path, trace in zip(paths, (RANK0, RANK1)):
        path.write_text(json.dumps(trace))
    monkeypatch.setattr(sys, "argv", ["kernel_time.py", *map(str, paths), "--steps", "2"])
    kernel_time.main()
    assert (f"{paths[1]} against {paths[0]}: started 1 of 2 matched collectives later, median +0.105 ms; "
            f"{paths[0]} waited 0.125 ms/step, {paths[1]} 0.020 ms/step") in capsys.readouterr().out
