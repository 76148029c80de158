"""The probe protocol in process (one gloo rank; a fake group for collective counts): a probe is one
module plus one line in the registry; the probes run in the documented order; summary.json holds only the keys its schema
writes down; the learning-rate schedules; the bad inputs of clipping, schedules and faults live in
tests/test_bad_input.py, and the multi-rank behaviour in tests/test_clip_schedule_localize.py."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import pytest
import torch

import fsdp_lab.train
from fsdp_lab.config import ConfigError, OptimConfig
from fsdp_lab.dist import DistContext
from fsdp_lab.optim import lr_factor
from fsdp_lab.probes import registry
from fsdp_lab.probes.profile import TOP_OPS
from fsdp_lab.summary import SCHEMA, base_summary, finished, keys_of
from fsdp_lab.worker import build_trainer
from microbatch_probe import MicrobatchProbe

TINY = ["debug=cpu_tiny", "mesh=single", "train.steps=3", "train.microbatches=2", "probes.parity.param_every=1"]


@pytest.fixture
def tiny(prepared):
    """`tiny(*overrides) -> (RunConfig, ParallelDims)`: a tiny 1-rank run, checked as the CLI does."""
    return lambda *overrides: prepared(*TINY, *overrides)


@pytest.fixture
def train(tiny, world_of_one):
    """`train(*overrides, run_dir=None) -> (trainer, rows, summary)`: the tiny run trained in this process."""

    def run_it(*overrides: str, run_dir: Path | None = None):
        run, dims = tiny(*overrides)
        rows: list[dict] = []
        trainer = build_trainer(run, dims, world_of_one, on_step=rows.append, run_dir=run_dir)
        trainer.run()
        summary = finished(
            base_summary(run, dims, "cpu"), steps=run.train.steps, final_loss=trainer.last_loss, probes=trainer.probes, checkpoint=None,
        )
        return trainer, rows, summary

    return run_it


@pytest.fixture
def with_microbatch_probe(monkeypatch):
    monkeypatch.setattr(registry, "PROBES", (*registry.PROBES, MicrobatchProbe))  # the one line


def test_a_new_probe_is_one_module_and_one_line(train, with_microbatch_probe):
    trainer, rows, summary = train()
    assert isinstance(trainer.probes[-1], MicrobatchProbe)
    # Two microbatches, each marking after_fwd/after_loss/after_bwd, around start/after_step/done.
    assert [(r["count/microbatches"], r["count/marks"]) for r in rows] == [(2, 9)] * 3
    assert summary["count"] == {"steps": 3}
    assert list(rows[0])[-2:] == ["count/microbatches", "count/marks"], "its row comes after the built-in probes'"


def test_a_new_probe_refuses_what_it_cannot_follow_before_any_rank_starts(tiny, with_microbatch_probe):
    with pytest.raises(ConfigError, match="train.steps=60 with the microbatch probe: allowed is <= 50"):
        tiny("train.steps=60")


def test_probes_are_built_in_the_documented_order(tiny, world_of_one):
    run, dims = tiny("probes.memory.tracker=module", "probes.comm.enabled=true")
    assert [type(p) for p in registry.build_probes(run, dims, world_of_one)] == list(registry.PROBES[:5])
    run, dims = tiny("probes.parity.enabled=false", "model=mlp_stack", "model.freeze=in_proj")
    assert [type(p).__name__ for p in registry.build_probes(run, dims, world_of_one)] == ["PhaseMemoryProbe", "ThroughputProbe", "FrozenProbe"]


def test_the_comm_probe_counts_each_units_collectives_per_step(prepared, fake_group):
    """Rank 0 of 2 on a fake group (collectives are issued, and do nothing): the tiny transformer's 3
    FSDP2 units (2 blocks and the root) each all-gather in forward and again in backward, or once when
    parameters stay gathered after forward, and each reduce-scatters its gradients once."""
    def counts(*overrides: str) -> list[tuple[int, int, int]]:
        run, dims = prepared("debug=cpu_tiny", "probes=off", "probes.comm.enabled=true", *overrides)
        fake_group(dims.world_size)
        ctx = DistContext(rank=0, local_rank=0, world_size=dims.world_size, device=torch.device("cpu"))
        rows: list[dict] = []
        build_trainer(run, dims, ctx, on_step=rows.append).run()
        return [(r["comm/all_gather_count"], r["comm/reduce_scatter_count"], r["comm/all_reduce_count"]) for r in rows]

    assert counts() == [(6, 3, 0)] * 2
    assert counts("fsdp.reshard_after_forward=false") == [(3, 3, 0)] * 2
    # The 2 blocks as one unit (wrap.group=2): one all-gather each way and one reduce-scatter for both.
    assert counts("wrap.group=2") == [(4, 2, 0)] * 2


def test_summary_holds_only_the_keys_of_its_schema(train):
    _, rows, summary = train("probes.memory.tracker=module", "probes.memory.tracker_step=2", "probes.parity.localize=true",
                             "probes.profile.enabled=true", "probes.profile.steps=1")
    assert keys_of(summary) <= set(SCHEMA), keys_of(summary) - set(SCHEMA)
    public = {"status", "error", "steps", "world_size", "device", "mesh", "final_loss", "parity.enabled", "parity.ok",
              "parity.reference", "parity.max_loss_abs_diff", "parity.max_param_abs_diff", "memory.peak_mib",
              "memory.phases_mib", "perf.step_time_s", "perf.tokens_per_s", "perf.mfu"}
    assert public <= keys_of(summary)
    # localize=true replays the last step even when nothing failed; nothing differs on one rank.
    assert summary["parity"]["localized"] == {"step": 3, "forward_module": None, "grad_module": None, "param": None, "report": "parity_report.json"}
    assert rows[1]["memory/tracker_accuracy"] is None and "memory/tracker_accuracy" not in rows[0]


def test_every_row_key_and_summary_section_is_declared_by_the_trainer_or_a_probe(train):
    trainer, rows, summary = train("probes.memory.tracker=module", "probes.comm.enabled=true")
    # `<phase>` in a declared key stands for a family of keys.
    pattern = re.compile("|".join(re.sub("<[a-z]+>", "[a-z_]+", re.escape(k)) for p in trainer.probes for k in p.metric_keys))
    undeclared = {k for r in rows for k in r if not pattern.fullmatch(k)}
    assert undeclared == {"step", "loss", "grad/norm", "lr"}, "only the trainer's own keys are left"
    sections = {k for p in trainer.probes for k in p.summary_keys}
    assert sections == {"parity", "memory", "perf"} and sections <= set(summary)


def test_the_perf_probe_times_the_host_s_issue_of_every_step_apart_from_the_step(train):
    """perf.host_step_s: the host's time to its last op (zero_grad), taken each step, within the step
    time (which also waits for the loss); the median over the steps after warm-up, as the step time."""
    trainer, rows, summary = train("probes.perf.warmup_steps=1")
    probe = next(p for p in trainer.probes if p.summary_keys == ("perf",))
    host = probe.throughput.host_times
    assert len(host) == len(rows) == 3 and all(0 < h <= r["perf/step_time_s"] for h, r in zip(host, rows))
    assert summary["perf"]["host_step_s"] == pytest.approx(statistics.median(host[1:]))


def traced_steps(run_dir: Path) -> list[str]:
    """The step spans in rank 0's trace of the profiled window."""
    events = json.loads((run_dir / "profile" / "trace_rank0.json").read_text())["traceEvents"]
    return sorted({e["name"] for e in events if e.get("name", "").startswith("step ")})


@pytest.mark.slow  # a profiled real run in process: seconds of CPU
def test_the_profiler_records_exactly_its_window_of_steps(train, tmp_path):
    """Steps 2-3 of 3 under torch.profiler: the trace holds their spans and no other step's, the op
    table and summary give per-step figures (the same matmuls per step whether 1 or 2 are profiled)."""
    trainer, _, summary = train("probes.profile.enabled=true", "probes.profile.first_step=2", "probes.profile.steps=2", run_dir=tmp_path)
    assert traced_steps(tmp_path) == ["step 2", "step 3"]
    profile = summary["profile"]
    assert (profile["first_step"], profile["steps"], profile["device"]) == (2, 2, "cpu")
    assert 0 < len(profile["top_ops"]) <= TOP_OPS
    assert profile["self_ms_per_step"] >= sum(op["self_ms_per_step"] for op in profile["top_ops"])
    mm = {op["name"]: op for op in trainer.probes[-1].window.ops}["aten::mm"]  # every op, beyond the summary's top
    assert mm["calls_per_step"] > 0 and 0 < mm["self_ms_per_step"] <= mm["total_ms_per_step"]
    assert "| `aten::mm` |" in (tmp_path / "profile" / "ops.md").read_text()

    one_step, _, _ = train("probes.profile.enabled=true", "probes.profile.first_step=3", "probes.profile.steps=1")
    assert {op["name"]: op for op in one_step.probes[-1].window.ops}["aten::mm"]["calls_per_step"] == mm["calls_per_step"]


@pytest.mark.parametrize("start_step,profiled", [(2, ["step 3"]), (3, [])])
def test_a_resumed_run_profiles_the_window_steps_it_trains(tiny, world_of_one, tmp_path, start_step, profiled):
    """Steps 2-3 of 4 are the window; a run resumed after step 2 profiles step 3 alone, one resumed
    after step 3 profiles none (and neither fails)."""
    run, dims = tiny("train.steps=4", "probes.profile.enabled=true", "probes.profile.first_step=2", "probes.profile.steps=2")
    trainer = build_trainer(run, dims, world_of_one, on_step=lambda row: None, run_dir=tmp_path)
    trainer.run(start_step=start_step)
    profile = finished(base_summary(run, dims, "cpu"), steps=4, final_loss=trainer.last_loss, probes=trainer.probes,
                       checkpoint=None)["profile"]
    assert profile["steps"] == len(profiled)
    if profiled:
        assert traced_steps(tmp_path) == profiled
        assert profile["first_step"] == 3 and "aten::mm" in {op["name"] for op in trainer.probes[-1].window.ops}
    else:
        assert not (tmp_path / "profile" / "trace_rank0.json").exists() and profile["top_ops"] == []


def test_a_profiler_window_past_the_last_step_is_refused(tiny):
    with pytest.raises(ConfigError, match=r"probes.profile.first_step=3: the window of probes.profile.steps=2 ends at step 4, past train.steps=3"):
        tiny("probes.profile.enabled=true", "probes.profile.steps=2")


def test_every_step_logs_the_learning_rate_and_the_gradient_norm(train):
    _, rows, summary = train("optim.schedule=linear", "optim.warmup_steps=1", "optim.max_norm=0.01")
    assert [r["lr"] for r in rows] == pytest.approx([0.0005, 0.001, 0.0005])
    assert all(r["grad/norm"] > 0.01 for r in rows), "pre-clip: above max_norm"
    assert summary["parity"]["ok"] and all(r["parity/grad_norm_abs_diff"] <= 1e-6 for r in rows)


@pytest.mark.parametrize("schedule,expected", [
    ("constant", [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]),
    ("linear", [0.25, 0.5, 0.75, 1.0, 2 / 3, 1 / 3]),
    ("cosine", [0.25, 0.5, 0.75, 1.0, 0.75, 0.25]),
])
def test_schedules_warm_up_then_decay_towards_zero(schedule, expected):
    factor = lr_factor(OptimConfig(schedule=schedule, warmup_steps=3), total_steps=6)
    assert [factor(s) for s in range(6)] == pytest.approx(expected)
    assert math.isclose(factor(6), 1.0 if schedule == "constant" else 0.0, abs_tol=1e-12)


def test_the_training_loop_names_no_probe_and_branches_on_none():
    """Trainer.run is data -> step -> row -> sinks: probes reach it only through the protocol, so
    train.py names no probe class and has no `probe is not None` branch (only the accumulation policy
    and the checkpointer it is handed are optional)."""
    source = Path(fsdp_lab.train.__file__).read_text()
    assert [cls.__name__ for cls in registry.PROBES if cls.__name__ in source] == []
    assert set(re.findall(r"([\w.]+) is not None", source)) <= {"self.accumulation", "checkpointer"}
