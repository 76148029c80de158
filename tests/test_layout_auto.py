"""layout=auto: the run takes the fastest fitting layout the plan predicts for its GPUs, keeping every
key the command line set (and the degrees of a mesh preset it chose); where no device table
describes the machine (this CPU) it keeps the config's layout and says why in one line."""

from __future__ import annotations

from fsdp_lab.compose import compose_cfg, to_run_config
from fsdp_lab.layout_auto import apply_layout, device_table, pick
from fsdp_lab.plan.cost import Layout
from fsdp_lab.plan.search import Candidate
from fsdp_lab.summary import SCHEMA, keys_of
from in_process import run_lab_here


def candidate(tp: int, ac: str, tokens_per_s: float, fits: bool = True) -> Candidate:
    layout = Layout(pp=1, dp_replicate=1, dp_shard=4 // tp, tp=tp, ac=ac, microbatches=1, microbatch_size=tp, reshard=True)
    return Candidate(layout, {"step_time_s": 1 / tokens_per_s, "peak_mib": 100.0}, fits, tokens_per_s, 0.5)


def test_device_tables_are_found_by_the_gpu_s_name_and_memory():
    assert device_table("NVIDIA H100 80GB HBM3", 79.2) == "h100-80gb"
    assert device_table("NVIDIA H200", 139.8) == "h200"
    assert device_table("NVIDIA H100 NVL", 93.0) == "h100-80gb"
    assert device_table("NVIDIA H100 PCIe (MIG 1g.10gb)", 9.5) is None, "a slice of a GPU is not the table's GPU"
    assert device_table("NVIDIA A100-SXM4-80GB", 79.2) is None
    assert device_table(None, 0.0) is None


def test_the_fastest_fitting_candidate_that_agrees_with_the_pinned_keys_is_taken():
    ranked = [candidate(4, "none", 900.0, fits=False), candidate(2, "none", 800.0), candidate(2, "full", 700.0), candidate(1, "full", 600.0)]
    best = pick(ranked, {})
    assert best["plan_rank"] == 2 and "mesh.tp=2" in best["overrides"] and "ac=none" in best["overrides"], "the first that fits"
    kept = pick(ranked, {"ac": "full", "train.steps": "3"})
    assert kept["plan_rank"] == 3 and kept["kept"] == ["ac=full"] and not any(o.startswith("ac=") for o in kept["overrides"])
    assert kept["predicted"] == {"step_time_s": 1 / 700.0, "peak_mib": 100.0, "tokens_per_s_per_gpu": 700.0}
    assert pick(ranked, {"mesh.tp": "1", "fsdp.reshard_after_forward": "True"})["plan_rank"] == 4, "true and True agree"
    assert pick(ranked, {"mesh.tp": "8"}) is None


def test_a_given_device_table_sets_the_layout_and_keeps_what_the_command_line_set():
    overrides = ["debug=cpu_tiny", "layout=auto", "plan.device=h100-80gb", "plan.gpus=2", "plan.top=1", "ac=full", "mesh=hsdp"]
    run = to_run_config(apply_layout(compose_cfg(*overrides), overrides))
    record = run.layout_auto
    assert (record["device"], record["gpus"]) == ("h100-80gb", 2)
    assert {"ac=full", "mesh.dp_replicate=2", "mesh.tp=1", "mesh.pp=1"} <= set(record["chosen"]["kept"]), "the ac and mesh=hsdp's degrees stay"
    assert run.ac.mode == "full" and (run.mesh.dp_replicate, run.mesh.dp_shard, run.mesh.tp) == (2, 1, 1), "2 GPUs: hsdp's 2 replicas of 1"
    applied = dict(o.split("=", 1) for o in record["chosen"]["overrides"])
    assert int(applied["train.batch_size"]) == run.train.batch_size and int(applied["train.microbatches"]) == run.train.microbatches
    assert 0 < record["predicted"]["step_time_s"] and 0 < record["predicted"]["peak_mib"] < 80 * 1024
    assert record["plan_s"] > 0, "what choosing added to the run's start"


def test_on_cpu_the_config_s_layout_is_kept_and_the_line_says_why(tmp_path):
    result = run_lab_here("debug=cpu_tiny", "layout=auto", "train.steps=1", "probes.parity.enabled=false", run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("layout=auto:")]
    assert lines == ["layout=auto: no device table describes this machine (no GPU visible); keeping the config's layout"]
    s = result.summary
    assert s["layout"] == {"mode": "auto", "device": None, "chosen": None, "reason": "no device table describes this machine (no GPU visible)"}
    assert s["status"] == "ok" and s["mesh"]["dp_shard"] == 1, "the config's mesh, a world of one here"
    assert keys_of(s) <= set(SCHEMA), keys_of(s) - set(SCHEMA)
