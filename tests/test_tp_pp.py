"""Tensor parallelism (2D with FSDP2) and pipeline parallelism (N-D with FSDP2 and TP), in real
multi-process runs on CPU/gloo, each with parity against a DDP reference that holds the whole model
and replicates over dp; and every rejection of a shape these layouts cannot split.

SGD with momentum and a large learning rate: parameters move far enough each step that a wrong
gradient (missing TP reduction, unscaled microbatches, a stage left out) shows in the parameters."""

from __future__ import annotations

import pytest

from fsdp_lab.config import ConfigError
from warm_lab import run_lab_warm

SGD = ("optim=sgd", "optim.lr=0.1", "logger=none")
TINY_TRANSFORMER = ("model.dim=16", "model.n_heads=2", "model.vocab_size=32", "train.seq_len=8")


def assert_parity(result, world_size: int, mesh: dict, steps: int) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    s = result.summary
    assert (s["status"], s["world_size"], s["steps"]) == ("ok", world_size, steps)
    assert {k: s["mesh"][k] for k in mesh} == mesh
    p = s["parity"]
    assert p["ok"] and p["max_loss_abs_diff"] <= 1e-5 and p["max_param_abs_diff"] <= 1e-5, p
    assert [r["step"] for r in result.metrics] == list(range(1, steps + 1))
    assert all(r["parity/loss_abs_diff"] <= 1e-5 for r in result.metrics)
    return s


@pytest.mark.slow
def test_tp2d_transformer_with_sequence_parallel_and_odd_ffn_matches_ddp(tmp_path):
    steps = 5
    result = run_lab_warm(
        "mesh=tp2d", "mesh.sequence_parallel=true", "model.ffn_dim=45", *TINY_TRANSFORMER, *SGD,
        f"train.steps={steps}", run_dir=tmp_path / "run",
    )
    s = assert_parity(result, 4, {"pp": 1, "dp_shard": 2, "tp": 2}, steps)
    assert "tp: transformer plan over 2 ranks, 2 blocks, sequence_parallel=True" in result.stdout + result.stderr
    assert s["memory"]["peak_mib"] > 0, "the memory probe follows TP"


@pytest.mark.slow
@pytest.mark.parametrize(
    "schedule,overrides,world_size,mesh,stages_line",
    [
        ("gpipe", ("mesh.pp=2", "mesh.world_size=2", *TINY_TRANSFORMER, "train.microbatches=2"), 2,
         {"pp": 2, "dp_shard": 1, "tp": 1}, "2 stages x 1 layers, this rank's stages [0], 2 microbatches"),
        # mlp_stack's odd hidden size 51 splits 26 + 25 over tp inside each stage.
        ("1f1b", ("mesh.pp=2", "mesh.tp=2", "mesh.world_size=4", "model=mlp_stack", "model.n_layers=4", "train.microbatches=4"), 4,
         {"pp": 2, "dp_shard": 1, "tp": 2}, "2 stages x 2 layers, this rank's stages [0], 4 microbatches"),
        # The smallest shape with all three: pp=2 x dp_shard=2 x tp=2, two stages per rank.
        ("interleaved_1f1b", ("mesh=nd", *TINY_TRANSFORMER, "model.ffn_dim=23", "model.n_layers=4", "mesh.sequence_parallel=true",
                              "train.microbatches=2"), 8,
         {"pp": 2, "dp_shard": 2, "tp": 2}, "4 stages x 1 layers, this rank's stages [0, 2], 2 microbatches"),
    ],
    ids=["gpipe-pp2", "1f1b-pp2xtp2-mlp_stack", "interleaved_1f1b-pp2xdp2xtp2"],
)
def test_pipeline_schedule_matches_unpipelined_ddp(tmp_path, schedule, overrides, world_size, mesh, stages_line):
    steps = 3
    result = run_lab_warm(
        *overrides, f"mesh.pp_schedule={schedule}", *SGD, f"train.steps={steps}", "launch.timeout_s=120",
        run_dir=tmp_path / "run",
    )
    # The parity loss is the reference's global mean, so it also checks that rank 0 (first stage)
    # reports the loss the last stage computed, averaged over dp.
    assert_parity(result, world_size, mesh, steps)
    assert f"pp: {schedule}, {stages_line}" in result.stdout + result.stderr


REFUSALS = [
    (("mesh=tp2d", "mesh.tp=4", "mesh.world_size=8", "model.dim=48", "model.n_heads=6"),
     "mesh.tp=4: must divide model.n_heads=6 (each rank computes whole heads of model.dim=48 = 6 heads x 8)"),
    (("mesh=tp2d", "model=convnet"), "mesh.tp=2: model.name=convnet has no tensor-parallel plan; allowed: hf, mlp, mlp_stack, transformer"),
    (("mesh=tp2d", "mesh.engine=ddp"), "mesh.engine=ddp with mesh.tp=2: tensor parallelism composes with mesh.engine=fsdp2 only"),
    (("mesh=tp2d", "model.tie_embeddings=true"), "model.tie_embeddings=true with mesh.tp=2: the embedding and the output"),
    (("mesh=tp2d", "mesh.sequence_parallel=true", "train.seq_len=33"),
     "mesh.tp=2 with mesh.sequence_parallel=true: must divide train.seq_len=33"),
    (("mesh=tp2d", "mesh.sequence_parallel=true", "model=mlp_stack"),
     "mesh.sequence_parallel=true: model.name=mlp_stack has no sequence-parallel plan; allowed with model.name=transformer"),
    (("mesh=nd", "model=mlp"), "mesh.pp=2: model.name=mlp cannot be split into stages; allowed: mlp_stack, transformer"),
    (("mesh=nd", "model.n_layers=3"),
     "model.n_layers=3: must be a multiple of the pipeline stages, mesh.pp=2 x 1 stages per rank (mesh.pp_stages_per_rank) = 2"),
    (("mesh=nd", "mesh.pp_schedule=interleaved_1f1b", "model.n_layers=6"),
     "model.n_layers=6: must be a multiple of the pipeline stages, mesh.pp=2 x 2 stages per rank (mesh.pp_stages_per_rank) = 4"),
    (("mesh=nd", "mesh.pp_schedule=interleaved_1f1b", "mesh.pp_stages_per_rank=1"),
     "mesh.pp_stages_per_rank=1: mesh.pp_schedule=interleaved_1f1b needs >= 2 stages per rank"),
    (("mesh=nd", "mesh.pp_stages_per_rank=2"), "mesh.pp_stages_per_rank=2: mesh.pp_schedule=gpipe runs one stage per rank"),
    (("mesh=nd", "mesh.pp_schedule=1f1b"), "train.microbatches=1: mesh.pp_schedule=1f1b needs >= mesh.pp=2 microbatches"),
    (("mesh=nd", "mesh.pp_schedule=interleaved_1f1b", "model.n_layers=4", "train.batch_size=5", "train.microbatches=5"),
     "train.microbatches=5: mesh.pp_schedule=interleaved_1f1b needs a multiple of its rounds, max(1, 5 // mesh.pp=2) = 2"),
    (("mesh=nd", "mesh.tp=1", "mesh.world_size=4", "model.tie_embeddings=true"),
     "model.tie_embeddings=true with mesh.pp=2: the first and last stages would share a weight"),
    (("mesh=nd", "probes.comm.enabled=true"), "probes.comm.enabled=true with mesh.pp=2: CommDebugMode's autograd hooks"),
    (("mesh=nd", "train.accum.sync=last"),
     "train.accum.sync=last, reshard_after_backward=true, explicit_unshard=false with mesh.pp=2: the pipeline schedule sets"),
    (("mesh=nd", "mesh.engine=ddp", "mesh.tp=1", "mesh.world_size=4"),
     "mesh.engine=ddp with mesh.pp=2: pipeline parallelism composes with mesh.engine=fsdp2 only"),
]


@pytest.mark.parametrize("overrides,message", REFUSALS, ids=[" ".join(o) for o, _ in REFUSALS])
@pytest.mark.bad_input
def test_shapes_that_cannot_be_split_are_refused_naming_every_factor(prepared, overrides, message):
    # In-process (fast); tests/test_bad_input.py runs a few of these through the command line.
    with pytest.raises(ConfigError) as refused:
        prepared(*overrides)
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


def test_presets_compose_to_runnable_meshes(prepared):
    _, dims = prepared("mesh=tp2d")
    assert dims.as_dict() == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 2}
    run, dims = prepared("mesh=nd")
    assert dims.as_dict() == {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "tp": 2}
    assert run.mesh.pp_schedule == "gpipe"
