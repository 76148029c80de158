"""Training on a real world of one rank, in this process: every model trains with parity against its
DDP reference, and what a run does besides (microbatches, a frozen pattern, a standalone block, DCP
checkpoints and resume) shows in its metrics, its probes' summaries and its files. The CLI's whole
path (compose, check, work as the rank, write the run dir) runs here too, as under a 1-rank torchrun."""

from __future__ import annotations

import json

import pytest

from fsdp_lab.checkpoint import complete_checkpoints, step_dir_name, verify
from fsdp_lab.checks import evaluate
from fsdp_lab.memory_phases import PHASES
from fsdp_lab.summary import probe_sections
from in_process import run_lab_here
from training import train
from wandb_records import OfflineRun

# debug=cpu_tiny's shape fits the transformer (and mlp_stack); every model family runs at its own defaults.
ANY_MODEL = ["device=cpu", "logger=none", "mesh=single", "optim=sgd", "train.steps=3", "train.seq_len=8", "probes.parity.param_every=1"]
ONE_RANK = ["debug=cpu_tiny", *ANY_MODEL]
MODELS = ["transformer", "mlp", "mlp_stack", "convnet", "vit", "unused_input", "multi_traversal"]


def assert_parity(trainer, rows, steps: int = 3) -> None:
    verdict = trainer.reference.verdict.as_summary()
    assert verdict["ok"] and verdict["max_loss_abs_diff"] <= 1e-5 and verdict["max_param_abs_diff"] <= 1e-5, verdict
    assert [r["step"] for r in rows] == list(range(1, steps + 1))


@pytest.mark.parametrize("model", MODELS)
def test_every_model_trains_like_its_ddp_reference(world_of_one, model):
    _, trainer, rows = train([*ANY_MODEL, f"model={model}"], world_of_one)
    assert_parity(trainer, rows)


def test_batch_norms_train_under_bf16_parameters_within_the_mixed_precision_drift(world_of_one):
    """FSDP2 casts a batch norm's weight and bias to bf16 while its running statistics stay float32
    (batch_norm takes one dtype: this run's rank failed so); the convnet's norms compute in float32."""
    _, trainer, rows = train([*ANY_MODEL, "model=convnet", "fsdp.param_dtype=bfloat16"], world_of_one)
    verdict = trainer.reference.verdict.as_summary()
    assert verdict["ok"] and 0 < verdict["max_loss_abs_diff"] <= 1e-2, verdict
    assert [r["step"] for r in rows] == [1, 2, 3]


@pytest.mark.parametrize("sync", ["every", "last", "reduce_scatter_only"])
def test_microbatches_accumulate_like_the_whole_batch(world_of_one, sync):
    _, trainer, rows = train([*ONE_RANK, "train.microbatches=2", f"train.accum.sync={sync}"], world_of_one)
    assert_parity(trainer, rows)


def test_a_frozen_pattern_leaves_those_parameters_bitwise_unchanged(world_of_one):
    run, trainer, rows = train([*ONE_RANK, "model=mlp_stack", "model.freeze=in_proj", "checks=[parity_ok,frozen_unchanged]"],
                               world_of_one)
    summary = probe_sections(trainer.probes)
    assert summary["frozen"]["params"] == 4 and summary["frozen"]["max_abs_change"] == 0.0, "in_proj weight and bias of 2 blocks"
    assert all(v["ok"] for v in evaluate(run.checks, summary, rows).values())


def test_a_standalone_block_trains_in_step_with_the_reference(world_of_one):
    _, trainer, rows = train([*ONE_RANK, "+experiment=torch_non_root_forward_backward", "train.steps=3"], world_of_one)
    assert_parity(trainer, rows)
    assert all(r["standalone/loss"] > 0 and r["parity/standalone_loss_abs_diff"] <= 1e-5 for r in rows)


def test_memory_phases_follow_the_physics_of_a_step(world_of_one):
    _, _, rows = train([*ONE_RANK, "optim=adamw"], world_of_one)
    for row in rows:
        m = {p: row[f"memory/{p}_mib"] for p in PHASES}
        assert m["after_fwd"] > m["start"], "forward keeps activations"
        assert m["done"] < m["after_step"], "zero_grad frees the gradients"
        assert row["memory/peak_mib"] >= max(m.values())
    assert rows[0]["memory/after_step_mib"] > rows[0]["memory/after_bwd_mib"], "the first step creates optimizer state"
    assert rows[1]["memory/start_mib"] > rows[0]["memory/start_mib"], "optimizer state persists into the next step"
    assert all(r["perf/tokens_per_s"] > 0 for r in rows[2:]), "throughput after the warm-up steps"


@pytest.fixture
def cli_run(tmp_path):
    """The CLI worked here as rank 0 of 1, with W&B offline and a DCP checkpoint every 2 steps."""
    result = run_lab_here(*ONE_RANK, "train.steps=4", "logger=wandb", "logger.mode=offline", "checkpoint=dcp",
                          "checkpoint.interval=2", run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_the_cli_path_writes_the_run_dir(cli_run):
    s = cli_run.summary
    assert (s["status"], s["steps"], s["world_size"], s["device"]) == ("ok", 4, 1, "cpu")
    assert s["mesh"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1, "engine": "fsdp2"}
    assert s["parity"]["ok"] and set(s["memory"]["phases_mib"]) == set(PHASES) and s["perf"]["tokens_per_s"] > 0
    rows = cli_run.metrics
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and s["final_loss"] == pytest.approx(rows[-1]["loss"])
    assert (cli_run.run_dir / ".hydra" / "config.yaml").exists()
    assert "step 4/4 | loss" in cli_run.stdout and cli_run.stdout.rstrip().endswith(f"run dir: {cli_run.run_dir}")
    wandb = OfflineRun.in_run_dir(cli_run.run_dir)
    assert [r["loss"] for r in wandb.history] == pytest.approx([r["loss"] for r in rows])
    assert wandb.summary["status"] == "ok"


def test_resume_continues_bitwise_from_the_newest_checkpoint(cli_run, tmp_path):
    assert [p.name for p in complete_checkpoints(cli_run.run_dir)] == [step_dir_name(2), step_dir_name(4)]
    assert verify(cli_run.run_dir / "checkpoints" / step_dir_name(4))["loss"] == cli_run.metrics[-1]["loss"]
    resumed_dir = tmp_path / "resumed"
    resumed = run_lab_here(*ONE_RANK, "train.steps=4", "logger=none", f"checkpoint.resume={cli_run.run_dir / 'checkpoints' / step_dir_name(2)}",
                           run_dir=resumed_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["step"] for r in resumed.metrics] == [3, 4]
    assert [r["loss"] for r in resumed.metrics] == [r["loss"] for r in cli_run.metrics[2:]], "bitwise: the same floats"
    assert json.loads((resumed_dir / "summary.json").read_text())["checkpoint"]["resumed_from"].endswith(step_dir_name(2))


def test_a_rank_that_raises_fails_the_run_keeping_what_was_written(tmp_path):
    result = run_lab_here(*ONE_RANK, "logger=none", "fault.kill_rank=0", "fault.at_step=2", "fault.kind=raise",
                          run_dir=tmp_path / "run")
    assert result.returncode == 1
    assert "RuntimeError: injected fault: rank 0 raised at step 2" in result.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "failed" and s["error"].startswith("rank 0: RuntimeError: injected fault")
    assert [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [1, 2]
