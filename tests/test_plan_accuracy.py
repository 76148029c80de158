"""benchmarks/plan_accuracy.py's CPU half on a tiny model: each measured row gets mode=estimate's peak
at its own overrides and world size (compiled rows as eager), its error against the measured peak,
and the table shows both memory predictions with their summary line."""

from __future__ import annotations

import pytest

from benchmark_scripts import load
from fsdp_lab import compose
from fsdp_lab.estimate import estimate

TINY = ["model.dim=128", "model.n_layers=2", "model.n_heads=4", "model.ffn_dim=256", "model.vocab_size=512",
        "train.seq_len=128", "train.batch_size=2", "fsdp.param_dtype=bfloat16", "logger=none"]
# name -> (extra overrides, world size); the measured figures are made up, the predictions are not.
ROWS = {"fsdp": ([], 2), "fsdp ac": (["ac=full"], 2), "fsdp compile": (["model.compile=true"], 2), "one gpu": ([], 1),
        "longer": (["train.seq_len=256"], 2)}
MEASURED_MIB = 100.0


def cli_estimate_mib(overrides: list[str], world: int) -> float:
    """What `python -m fsdp_lab mode=estimate OVERRIDES mesh.world_size=WORLD` predicts."""
    return estimate(*compose.prepared("mode=estimate", *overrides, f"mesh.world_size={world}"))["peak_mib"]


@pytest.fixture(scope="module")
def accuracy():
    module = load("plan_accuracy")
    rows = [{"config": name, "overrides": [*TINY, *extra], "world_size": world, "step_time_s": 0.01, "peak_mib": MEASURED_MIB}
            for name, (extra, world) in ROWS.items()]
    return module, {r["config"]: r for r in module.predict(rows, "h200", 8)}


@pytest.mark.slow  # its fixture estimates every row: tens of CPU seconds
def test_each_row_gets_the_estimate_s_peak_at_its_own_overrides_and_world(accuracy):
    _, rows = accuracy
    expected = {name: cli_estimate_mib([*TINY, *extra], world) for name, (extra, world) in ROWS.items() if name != "fsdp compile"}
    assert len(set(expected.values())) == len(expected)  # AC, the world size, the length move the peak: each row's own
    for name, mib in expected.items():
        assert rows[name]["estimated_peak_mib"] == pytest.approx(mib, rel=1e-9), name
        assert rows[name]["estimated_peak_error"] == pytest.approx(mib / MEASURED_MIB - 1, rel=1e-9)
    assert rows["fsdp compile"]["estimated_peak_mib"] == pytest.approx(expected["fsdp"], rel=1e-9)  # traced eager


@pytest.mark.slow
def test_the_table_shows_both_memory_predictions_and_their_summary(accuracy):
    module, rows = accuracy
    table = module.markdown(list(rows.values()), "h200")
    assert "| closed form MiB | error | estimate MiB | error |" in table and "compiled rows as eager" in table
    r = rows["fsdp ac"]
    assert (f"| {MEASURED_MIB:.0f} | {r['predicted_peak_mib']:.0f} | {r['peak_error']:+.1%} "
            f"| {r['estimated_peak_mib']:.0f} | {r['estimated_peak_error']:+.1%} |") in table
    errors = sorted(abs(r["estimated_peak_error"]) for r in rows.values())
    assert f"peak memory, estimate: median |error| {errors[2]:.1%}, max {errors[-1]:.1%}" in table


def test_a_layout_auto_run_of_speed_py_is_priced_in_the_layout_it_chose():
    """speed.py's --json keeps a lab run's summary `layout`; the row appends the chosen overrides (the
    later key wins when composed), and a run without the record keeps its own."""
    chosen = ["mesh.dp_shard=4", "fsdp.reshard_after_forward=false", "wrap.group=1"]
    run = {"tokens_per_s": 1.0, "peak_mib": 2.0, "host_step_s": 0.1, "step_time_s": 0.4}
    measured = {"gpus": 4, "runs": {
        "lab:auto": [{**run, "overrides": ["+experiment=bench_llama1b", "layout=auto"],
                      "layout": {"mode": "auto", "chosen": {"overrides": chosen, "kept": []}}}],
        "lab:cpu": [{**run, "overrides": ["+experiment=bench_llama1b", "layout=auto"], "layout": {"mode": "auto", "chosen": None}}],
        "lab": [{**run, "overrides": ["+experiment=bench_llama1b"]}]}}
    rows = {r["config"]: r for r in load("plan_accuracy").measured_rows(measured)}
    assert rows["lab:auto"]["overrides"] == ["+experiment=bench_llama1b", "layout=auto", *chosen]
    assert rows["lab:cpu"]["overrides"] == ["+experiment=bench_llama1b", "layout=auto"]
    assert rows["lab"]["overrides"] == ["+experiment=bench_llama1b"]
