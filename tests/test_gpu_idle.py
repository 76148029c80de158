"""benchmarks/gpu_idle.py on a hand-made trace: the device's gaps inside the profiled steps, each
charged to the host annotation and aten op running when it began; a trace without step spans
(the yardsticks' loop) is taken whole."""

from __future__ import annotations

import pytest

from benchmark_scripts import load, span


@pytest.fixture(scope="module")
def gpu_idle():
    return load("gpu_idle")


HOST = [
    span("user_annotation", "FSDP::pre_forward (layers.3)", 100, 200),
    span("cpu_op", "aten::copy_", 150, 20),
    span("cpu_op", "aten::mm", 400, 10),
]
# Busy 10-150 and 200-450 on two streams that overlap, then 460-560: gaps 150-200 and 450-460.
DEVICE = [span("kernel", "k1", 10, 140), span("kernel", "k2", 200, 200), span("gpu_memcpy", "c", 300, 150),
          span("kernel", "k3", 460, 100)]


def test_gaps_are_charged_to_what_the_host_was_running(gpu_idle):
    trace = {"traceEvents": [span("user_annotation", "step 4", 0, 1000), *HOST, *DEVICE]}
    total, idle, charged = gpu_idle.idle_by_host_activity(trace, min_us=2)
    assert total == 550 and idle == 60
    assert charged == {"FSDP::pre_forward (layers.N)  /  aten::copy_": 50, "-  /  -": 10}
    # Gaps shorter than min_us are launch latency, not counted.
    assert gpu_idle.idle_by_host_activity(trace, min_us=20)[1] == 50


def test_a_trace_without_step_spans_is_taken_whole(gpu_idle):
    total, idle, _ = gpu_idle.idle_by_host_activity({"traceEvents": [*HOST, *DEVICE]}, min_us=2)
    assert (total, idle) == (550, 60)
