"""benchmarks/host_time.py on a hand-made trace: each host thread's time by its innermost
annotation (nested annotations' time taken out of their parents'), the window from the step spans
or the whole trace, and the runtime calls that launch kernels or block the host."""

from __future__ import annotations

import pytest

from benchmark_scripts import load, span


@pytest.fixture(scope="module")
def host_time():
    return load("host_time")


MAIN = [
    span("user_annotation", "step 7", 0, 1000),
    span("user_annotation", "FSDP::pre_forward (layers.3)", 100, 200),
    span("user_annotation", "FSDP::all_gather (layers.3)", 150, 50),
    span("cpu_op", "aten::copy_", 160, 20),
    span("cuda_runtime", "cudaLaunchKernel", 165, 5),
    span("cpu_op", "aten::mm", 400, 100),
    span("cuda_runtime", "cudaLaunchKernel", 410, 10),
    span("cpu_op", "aten::_local_scalar_dense", 600, 300),
    span("cuda_runtime", "cudaStreamSynchronize", 610, 280),
    # Past the step's span: outside the window.
    span("cpu_op", "aten::mm", 1100, 50),
    span("cuda_runtime", "cudaLaunchKernel", 1110, 10),
]


def test_time_goes_to_the_innermost_annotation_and_the_rest_outside_any(host_time):
    spans, steps = host_time.window(MAIN, unnamed_steps=2)
    assert (spans, steps) == ([(0, 1000)], 1)
    times = host_time.exclusive_by_annotation(MAIN, spans)
    # pre_forward 200 µs less its all-gather's 50; the mm (100) and the blocked item (300) outside both.
    assert times == {"FSDP::pre_forward (layers.N)": 150, "FSDP::all_gather (layers.N)": 50, "-": 400}


def test_launches_and_blocking_calls_are_counted_inside_the_window(host_time):
    launched, launch_us, blocked = host_time.runtime_calls(MAIN, [(0, 1000)])
    assert (launched, launch_us) == (2, 15)
    assert blocked == {"cudaStreamSynchronize": (1, 280)}


def test_a_trace_without_step_spans_is_its_host_span_over_the_given_steps(host_time):
    events = [e for e in MAIN if e["name"] != "step 7"]
    assert host_time.window(events, unnamed_steps=2) == ([(100, 1150)], 2)


def test_threads_are_named_by_what_they_run(host_time):
    assert host_time.thread_name(MAIN) == "main"
    assert host_time.thread_name([span("cpu_op", "autograd::engine::evaluate_function: MmBackward0", 0, 5, tid=2)]) == "autograd"
    assert host_time.thread_name([span("cpu_op", "gloo:all_reduce", 0, 5, tid=3)]) == "other"
