"""PyTorch's test_fully_shard_training scenarios beyond their verdicts (tests/test_torch_scenarios.py
checks those for every torch_* experiment): the same scenarios with reshard_after_forward=false, the
non-root block's own losses, float64 training, a 2D checkpoint resume that ends bitwise like an
uninterrupted run, and the refusals of settings these scenarios cannot combine with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from checkpoints import assert_bitwise_equal, params
from fsdp_lab.checkpoint import step_dir_name
from fsdp_lab.checks import resumed
from fsdp_lab.config import ConfigError
from warm_lab import run_lab_warm

NO_RESHARD = ("torch_multi_group", "torch_multi_forward_module", "torch_non_root_forward_backward", "torch_float64_after_sharding")


@pytest.fixture(scope="module")
def no_reshard(tmp_path_factory) -> dict[str, tuple[dict, list[dict], Path]]:
    """The 2-rank scenarios, each with reshard_after_forward=false (their experiments reshard)."""
    sweep_dir = tmp_path_factory.mktemp("no_reshard")
    result = run_lab_warm("-m", f"+experiment={','.join(NO_RESHARD)}", "fsdp.reshard_after_forward=false", "train.steps=3",
                     "logger=none", "hydra.launcher.max_ranks=4", f"hydra.sweep.dir={sweep_dir}", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = {}
    for job in (p for p in sweep_dir.iterdir() if p.is_dir()):
        experiment = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())[0].split("=", 1)[1]
        rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
        out[experiment] = (json.loads((job / "summary.json").read_text()), rows, job)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("experiment", NO_RESHARD)
def test_parity_holds_without_resharding_after_forward(no_reshard, experiment):
    summary, rows, _ = no_reshard[experiment]
    assert summary["status"] == "ok" and summary["parity"]["ok"], summary["parity"]
    assert [r["step"] for r in rows] == [1, 2, 3]


@pytest.mark.slow
def test_groups_kept_unsharded_after_forward_all_gather_once(no_reshard):
    """test_train_parity_multi_group: 3 groups (2 blocks + root) all-gather once per step without
    resharding, twice with it (the experiment's verdict all_gather_per_step:6)."""
    _, rows, _ = no_reshard["torch_multi_group"]
    assert {r["comm/all_gather_count"] for r in rows} == {3}
    assert {r["comm/reduce_scatter_count"] for r in rows} == {3}


@pytest.mark.slow
def test_the_non_root_block_trains_alone_in_step_with_ddp(no_reshard):
    """test_non_root_forward_backward: every step also reports the lone block's loss, equal to the
    reference's (whose gradients of that block are averaged by hand)."""
    summary, rows, _ = no_reshard["torch_non_root_forward_backward"]
    assert all(r["standalone/loss"] > 0 and r["standalone/loss"] != r["loss"] for r in rows)
    assert all(r["parity/standalone_loss_abs_diff"] <= 1e-5 for r in rows)
    assert "parity/param_max_abs_diff" in rows[-1] and summary["parity"]["max_param_abs_diff"] <= 1e-4


@pytest.mark.slow
def test_a_model_cast_to_float64_after_sharding_trains_in_float64(no_reshard):
    """test_to_float64_after_init: float64's tolerance (1e-10) against a float64 reference; the
    lab checks every shard's dtype after the cast and logs it."""
    summary, _, job = no_reshard["torch_float64_after_sharding"]
    p = summary["parity"]
    assert (p["reference"], p["tolerance"]) == ("ddp-float64", 1e-10) and p["ok"], p
    text = "".join(f.read_text(errors="replace") for f in (job / "logs").rglob("*") if f.is_file())
    assert "cast after sharding: 4 parameters and their shards now torch.float64" in text


@pytest.fixture(scope="module")
def resume_pair(tmp_path_factory):
    """The 2D checkpoint-resume experiment (rank 1 killed after step 2, restarted, resumed) and the same
    run without the fault, 3 steps each (the last one after the resume)."""
    runs = {}
    for name, fault in (("resumed", ()), ("uninterrupted", ("fault.kill_rank=null", "fault.at_step=null"))):
        runs[name] = run_lab_warm("+experiment=torch_2d_checkpoint_resume", "train.steps=3", "logger=none", *fault,
                             run_dir=tmp_path_factory.mktemp(name) / "run", timeout=600)
        assert runs[name].returncode == 0, runs[name].stderr[-3000:]
    return runs


@pytest.mark.slow
def test_2d_checkpoint_resume_ends_bitwise_like_an_uninterrupted_run(resume_pair, tmp_path):
    interrupted, uninterrupted = resume_pair["resumed"], resume_pair["uninterrupted"]
    assert interrupted.summary["checkpoint"]["resumed_from"].endswith(step_dir_name(2))
    assert uninterrupted.summary["checkpoint"]["resumed_from"] is None
    assert interrupted.summary["checks"]["resumed"]["ok"] and not uninterrupted.summary["checks"]["resumed"]["ok"]
    assert interrupted.summary["mesh"] == uninterrupted.summary["mesh"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 2, "engine": "fsdp2"}
    assert [r["step"] for r in interrupted.metrics] == [1, 2, 3]
    assert [r["loss"] for r in interrupted.metrics] == [r["loss"] for r in uninterrupted.metrics], "bitwise: the same floats"
    last = step_dir_name(3)
    assert_bitwise_equal(params(interrupted.run_dir / "checkpoints" / last, tmp_path), params(uninterrupted.run_dir / "checkpoints" / last, tmp_path))


REFUSALS = [
    (("model=mlp_stack", "model.layer_order=[0,3]"), "model.layer_order=[0, 3]: block indices in 0..2 (model.n_layers=3)"),
    (("model=mlp_stack", "model.layer_order=[0,0,1]", "probes.comm.enabled=true"),
     "probes.comm.enabled=true with model.layer_order=[0, 0, 1]: CommDebugMode cannot follow a block called twice"),
    (("train.standalone_layer=0",), "train.standalone_layer=0: needs a block that takes the model's inputs and returns logits"),
    (("model=mlp_stack", "train.standalone_layer=3"), "train.standalone_layer=3: a block index in 0..2"),
    (("model=mlp_stack", "train.standalone_layer=0", "mesh.engine=fsdp1"), "train.standalone_layer=0 with mesh.engine=fsdp1"),
    (("model=vit", "mesh.engine=fsdp1"), "model.name=vit with mesh.engine=fsdp1: FSDP1 unshards a unit around forward only"),
    (("model=vit", "ac=full"), "ac.mode=full with model.name=vit"),
    (("mesh=ddp", "fsdp.post_optim_event=true"), "fsdp.post_optim_event=true: applies to mesh.engine=fsdp2, not mesh.engine=ddp"),
    (("mesh=ddp", "fsdp.cast_after_sharding=float64"), "fsdp.cast_after_sharding=float64: applies to mesh.engine=fsdp2"),
    (("mesh=ddp", "fsdp.symm_mem=true"), "fsdp.symm_mem=true: applies to mesh.engine=fsdp2, not mesh.engine=ddp"),
    (("mesh=ddp", "fsdp.force_sum_reduction=true"), "fsdp.force_sum_reduction=true: applies to mesh.engine=fsdp2, not mesh.engine=ddp"),
    (("mesh=nd", "fsdp.cast_after_sharding=float64"), "fsdp.cast_after_sharding=float64 with mesh.pp=2"),
    (("mesh=nd", "model=mlp_stack", "model.n_layers=2", "train.standalone_layer=0"), "train.standalone_layer=0 with mesh.pp=2"),
    (("mode=estimate", "mesh.world_size=2", "fsdp.cast_after_sharding=float64"), "fsdp.cast_after_sharding=float64: mode=estimate cannot predict this"),
]


@pytest.mark.parametrize("overrides,message", REFUSALS, ids=[m.split(":")[0] for _, m in REFUSALS])
def test_settings_these_scenarios_cannot_combine_with_are_refused(prepared, overrides, message):
    with pytest.raises(ConfigError) as e:
        prepared(*overrides)
    assert str(e.value).startswith(message), str(e.value)


def test_resumed_needs_a_checkpoint_and_every_step_once():
    steps = [{"step": i} for i in (1, 2, 3)]
    assert resumed({"steps": 3, "checkpoint": {"resumed_from": "run/checkpoints/step_00000002"}}, steps)["ok"]
    assert not resumed({"steps": 3, "checkpoint": {"resumed_from": None}}, steps)["ok"]
    assert not resumed({"steps": 3, "checkpoint": None}, steps)["ok"]
    assert not resumed({"steps": 3, "checkpoint": {"resumed_from": "x"}}, steps + [{"step": 3}])["ok"], "a step written twice"
