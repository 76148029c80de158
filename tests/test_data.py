"""Synthetic data keyed by the global sample index: every layout with the same global batch sees the
same samples, and train.global_batch_size decides the per-rank batch."""

from __future__ import annotations

import pytest
import torch

from fsdp_lab.config import ConfigError
from fsdp_lab.data import DataPosition, microbatches
from fsdp_lab.models import build_model

GLOBAL_BATCH = 8


def step_samples(model, step: int, dp: int, position: DataPosition | None = None) -> torch.Tensor:
    """The inputs of `step` on `dp` data-parallel ranks, concatenated in rank order."""
    position = position or DataPosition(GLOBAL_BATCH)
    per_rank = GLOBAL_BATCH // dp
    return torch.cat([
        microbatches(model, seed=0, first_sample=position.next_sample(step) + r * per_rank, batch_size=per_rank,
                     seq_len=8, n=1, device=torch.device("cpu"))[0][0]
        for r in range(dp)
    ])


@pytest.mark.parametrize("model_name", ["transformer", "mlp"])
def test_every_data_parallel_size_sees_the_same_samples_per_step(compose_run, model_name):
    model = build_model(compose_run(f"model={model_name}").model, seed=0)
    for step in (0, 5):
        one = step_samples(model, step, dp=1)
        for dp in (2, 4, 8):
            assert torch.equal(step_samples(model, step, dp), one), f"dp={dp}, step {step}"
    assert not torch.equal(step_samples(model, 0, 1), step_samples(model, 1, 1)), "each step its own samples"


def test_a_position_resumed_with_another_global_batch_continues_at_its_sample():
    saved = DataPosition(global_batch=16)
    resumed = DataPosition(global_batch=8).resumed(step=3, sample=saved.next_sample(3))
    assert (saved.next_sample(3), resumed.next_sample(3), resumed.next_sample(5)) == (48, 48, 64)


@pytest.mark.parametrize("overrides,batch_size", [
    (("train.global_batch_size=8", "mesh.world_size=4"), 2),
    (("train.global_batch_size=8", "mesh.world_size=4", "mesh.tp=2"), 4),
    (("train.global_batch_size=8", "mesh.world_size=4", "mesh.dp_replicate=2"), 2),
    (("mesh.world_size=4",), 4),
])
def test_global_batch_size_decides_the_per_rank_batch(prepared, overrides, batch_size):
    run, _ = prepared("device=cpu", *overrides)
    assert run.train.batch_size == batch_size


@pytest.mark.bad_input
def test_a_global_batch_the_data_parallel_ranks_cannot_share_is_refused(prepared):
    with pytest.raises(ConfigError, match=r"train.global_batch_size=6: must be a multiple of the data-parallel size 4 "
                                          r"\(mesh.dp_replicate=1 x mesh.dp_shard=4\)"):
        prepared("device=cpu", "train.global_batch_size=6", "mesh.world_size=4")
