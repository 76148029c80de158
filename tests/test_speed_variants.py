"""benchmarks/speed.py on the CPU at its tiny shape: the host time per step of the lab and of the
yardsticks' loop; the lab variants: `--variant NAME=OVERRIDES` runs the
lab once more with those overrides as the peer `lab:NAME`, alternated with the others (each round in
the reverse order of the one before), and the table
sets it against the lab; overrides that the lab refuses end the benchmark naming them, keeping
in --json the runs made before; `--profile DIR --profile-runs all` profiles every run apart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmark_scripts import load

REPO = Path(__file__).resolve().parent.parent


def speed(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/speed.py", "--shape", "tiny", "--runs", "1", "--peers", "lab", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def cut_short(tmp_path_factory):
    """One invocation with both the yardsticks' loop and a variant the lab refuses: its first round runs
    the lab, then the hand-written loop, then ends at the refused variant, keeping both runs in --json
    (one speed.py process and one lab run for what two invocations showed apart)."""
    out = tmp_path_factory.mktemp("speed") / "cut.json"
    result = speed("--peers", "lab,hand-written", "--variant", "wide=model.dim=-3", "--json", str(out))
    return result, json.loads(out.read_text())


@pytest.mark.slow
def test_a_variant_runs_beside_the_lab_with_its_overrides(tmp_path, cut_short):
    result = speed("--variant", "prefetch=fsdp.forward_prefetch=1", "--json", str(tmp_path / "runs.json"), "--runs", "2",
                   "--profile", str(tmp_path / "prof"), "--profile-runs", "all")
    assert result.returncode == 0, result.stderr[-2000:]
    # --profile-runs all: every run's own profile, each rank's trace and the ops table, beside the other runs'.
    for peer in ("lab", "lab-prefetch"):
        for run in ("run0", "run1"):
            written = {f.name for f in (tmp_path / "prof" / peer / run).iterdir()}
            assert {"ops.md", "trace_rank0.json", "trace_rank1.json"} <= written, (peer, run, written)
    runs = json.loads((tmp_path / "runs.json").read_text())["runs"]
    assert list(runs) == ["lab", "lab:prefetch"] and all(r["tokens_per_s"] > 0 for rs in runs.values() for r in rs)
    # Each round in the reverse order of the one before: lab first and last, the variant in between.
    assert [r["at"] for r in runs["lab"]] == [0, 3] and [r["at"] for r in runs["lab:prefetch"]] == [1, 2]
    assert all(r["wall_s"] > 1 for rs in runs.values() for r in rs)  # a lab run's whole process, spawn included
    # When each ran, for benchmarks/gpu_clocks.py to set the GPUs' samples beside it: one after another.
    spans = sorted((r["started"], r["ended"]) for rs in runs.values() for r in rs)
    assert all(start < end <= next_start for (start, end), (next_start, _) in zip(spans, spans[1:] + [(float("inf"), 0)]))
    assert "lab:prefetch/lab" in result.stdout
    # Each lab run keeps its overrides, so that plan_accuracy.py can predict the runs of a speed.py --json.
    assert all(r["overrides"][0] == "+experiment=bench_llama1b" for rs in runs.values() for r in rs)
    assert "fsdp.forward_prefetch=1" in runs["lab:prefetch"][0]["overrides"] and "fsdp.forward_prefetch=1" not in runs["lab"][0]["overrides"]
    rows = load("plan_accuracy").measured_rows(json.loads((tmp_path / "runs.json").read_text()))
    assert [r["config"] for r in rows] == ["lab", "lab:prefetch"] and all(r["runs"] == 2 and r["step_time_s"] > 0 for r in rows)
    # The host's time to issue a step, from the lab's perf.host_step_s: below the whole step's.
    assert all(0 < r["host_step_s"] < 2 * 32 / r["tokens_per_s"] for rs in runs.values() for r in rs)  # batch 2 x seq 32 a step
    assert "host ms/step" in result.stdout
    refused, kept = cut_short
    assert refused.returncode != 0 and "model.dim=-3" in refused.stderr
    # The runs before the refused variant are kept, as a run cut off by a time limit keeps its runs.
    assert list(kept["runs"]) == ["lab", "hand-written", "lab:wide"]
    assert [len(r) for r in kept["runs"].values()] == [1, 1, 0] and kept["medians"]["lab"]["tokens_per_s"] > 0


def test_the_labs_layout_per_mode_changes_the_experiment_and_is_accepted(prepared):
    """speed.py's LAYOUT and FLOAT8_LAYOUT: each mode's overrides must be ones the lab accepts for the
    mode's experiment, and must change it (an override the experiment already sets would be a layout
    nobody measured apart); none means the experiment's own layout."""
    speed_script = load("speed")
    for (shape, compiled), overrides in [*speed_script.LAYOUT.items(), *speed_script.FLOAT8_LAYOUT.items()]:
        experiment = "+experiment=bench_llama1b_compiled" if compiled else "+experiment=bench_llama1b"
        base, _ = prepared(experiment, "mesh.world_size=2")
        run, _ = prepared(experiment, "mesh.world_size=2", *overrides)
        assert (run != base) == bool(overrides), (shape, compiled)


def test_the_compiled_experiment_is_the_eager_one_compiled_in_its_own_layout(prepared):
    """bench_llama1b_compiled: the same model and training as bench_llama1b, compiled, resharding two
    blocks to a unit where the eager experiment keeps four gathered."""
    eager, _ = prepared("+experiment=bench_llama1b", "mesh.world_size=2")
    compiled, _ = prepared("+experiment=bench_llama1b_compiled", "mesh.world_size=2")
    assert compiled.model.compile and not eager.model.compile
    assert (compiled.fsdp.reshard_after_forward, compiled.wrap.group) == (True, 2)
    assert (eager.fsdp.reshard_after_forward, eager.wrap.group) == (False, 4)
    assert compiled.model.dim == eager.model.dim and compiled.train == eager.train and compiled.optim == eager.optim


def test_a_layout_auto_variant_runs_without_the_modes_hand_set_layout():
    """layout=auto keeps what the command line pins: speed.py's per-mode layout would pin its choice."""
    own_layout = load("speed").own_layout
    layout = ["fsdp.reshard_after_forward=true", "wrap.group=2"]
    overrides = ["model.dim=64", *layout, "model.compile=true"]
    assert own_layout(overrides, layout, ["layout=auto"]) == ["model.dim=64", "model.compile=true", "layout=auto"]
    assert own_layout(overrides, layout, ["ac=full"]) == [*overrides, "ac=full"]


def test_a_variant_with_a_global_batch_runs_without_the_shapes_batch_per_gpu():
    """Under layout=auto a pinned train.batch_size would keep every layout at one GPU's share per
    data-parallel rank; a variant's global batch lets the plan choose it at the same tokens a step."""
    own_layout = load("speed").own_layout
    overrides = ["train.seq_len=4096", "train.batch_size=1", "model.compile=true"]
    variant = ["layout=auto", "train.global_batch_size=4"]
    assert own_layout(overrides, [], variant) == ["train.seq_len=4096", "model.compile=true", *variant]
    assert own_layout(overrides, [], ["layout=auto"]) == [*overrides, "layout=auto"]


@pytest.mark.slow
def test_the_yardsticks_loop_reports_the_hosts_time_per_step_beside_the_labs(cut_short):
    result, kept = cut_short
    assert "hand-written" in result.stdout, result.stderr[-2000:]  # its run's line, before the refusal
    medians = kept["medians"]
    for name in ("lab", "hand-written"):
        assert 0 < medians[name]["host_step_s"] < 2 * 32 / medians[name]["tokens_per_s"], name


def test_the_variants_ratios_go_against_the_column_versus_names_and_mfu_needs_no_plain_lab_column():
    """float8 under layout=auto against the lab's bf16, in an invocation that runs no plain lab column."""
    speed_script = load("speed")
    variants = {"lab:auto": ["layout=auto"], "lab:bf16": ["float8.recipe=none"]}
    peers = ["torchtitan", "lab:auto", "lab:bf16"]
    assert speed_script.ratio_columns(peers, variants, "lab:bf16") == [
        ("lab:auto", "torchtitan"), ("lab:bf16", "torchtitan"), ("lab:auto", "lab:bf16")]
    # The default sets each variant against the lab, and against no variant where the lab did not run.
    assert ("lab:prefetch", "lab") in speed_script.ratio_columns(["lab", "lab:prefetch"], {"lab:prefetch": []}, "lab")
    assert speed_script.ratio_columns(peers, variants, "lab") == [("lab:auto", "torchtitan"), ("lab:bf16", "torchtitan")]
    run = {"peak_mib": 1.0, "host_step_s": 0.1}
    medians = speed_script.medians_of({"torchtitan": [{**run, "tokens_per_s": 80.0}],
                                       "lab:auto": [{**run, "tokens_per_s": 100.0, "mfu": 0.5}],
                                       "lab:bf16": [{**run, "tokens_per_s": 60.0, "mfu": 0.3}]})
    assert medians["torchtitan"]["mfu"] == pytest.approx(0.4) and medians["lab:bf16"]["mfu"] == pytest.approx(0.3)


def test_profile_runs_puts_every_run_apart_or_only_the_first():
    profile_dir_of = load("speed").profile_dir_of
    root = Path("/prof")
    assert profile_dir_of(root, "lab:f8", 0, every=False) == root / "lab-f8"
    assert profile_dir_of(root, "lab:f8", 1, every=False) is None
    assert profile_dir_of(root, "lab:f8", 1, every=True) == root / "lab-f8" / "run1"
    assert profile_dir_of(None, "lab", 0, every=True) is None


@pytest.mark.parametrize("args, message", [
    (["--versus", "lab:none"], "--versus=lab:none: expected lab or one of the variants (none given)"),
    (["--profile-runs", "all"], "--profile-runs=all: profiles go under --profile DIR"),
])
def test_refused_before_any_run_starts(monkeypatch, capsys, args, message):
    """In process: nothing is spawned."""
    monkeypatch.setattr(sys, "argv", ["speed.py", "--shape", "tiny", "--peers", "lab", *args])
    with pytest.raises(SystemExit) as refused:
        load("speed").main()
    assert refused.value.code == 2
    assert message in capsys.readouterr().err


def test_gpu_clocks_is_refused_without_nvidia_smi(monkeypatch, capsys, tmp_path):
    speed_script = load("speed")
    monkeypatch.setattr(speed_script.shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "argv", ["speed.py", "--shape", "tiny", "--peers", "lab", "--gpu-clocks", str(tmp_path / "smi.csv")])
    with pytest.raises(SystemExit) as refused:
        speed_script.main()
    assert refused.value.code == 2
    assert f"--gpu-clocks={tmp_path / 'smi.csv'}: needs nvidia-smi, which this machine lacks" in capsys.readouterr().err
    assert not (tmp_path / "smi.csv").exists()
