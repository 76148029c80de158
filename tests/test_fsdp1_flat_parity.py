"""The FSDP1 parity probe compares each rank's flat shard with the right slices of the reference:
real FSDP1 over a fake 2-rank group, each rank's shard built in turn in this process (FSDP1 cuts its
flat shards locally; the fake group reduces nothing, so each rank's own comparison shows), on
odd-sized MLPs (uneven shards, padding), every strategy that shards differently, with and without
use_orig_params (which adds alignment padding inside the shard)."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from fsdp_lab.config import FSDPConfig
from fsdp_lab.models.mlp import MLPStack
from fsdp_lab.parallel.fsdp1 import apply_fsdp1
from fsdp_lab.probes.flat_shards import flat_shard_pairs
from fsdp_lab.probes.parity import max_param_abs_diff

WORLD = 2
CASES = list(itertools.product(("full_shard", "shard_grad_op", "no_shard"), (False, True)))


@pytest.mark.parametrize("strategy,orig", CASES, ids=[f"{s}-use_orig_params={o}" for s, o in CASES])
def test_flat_shards_cover_every_element_and_match_the_reference(fake_group, strategy, orig):
    covered, after_change = 0, []
    for rank in range(WORLD):
        fake_group(WORLD, rank)
        torch.manual_seed(0)
        model = MLPStack(17, 51, 3)
        reference = copy.deepcopy(model)
        total = sum(p.numel() for p in model.parameters())
        cfg = FSDPConfig(sharding_strategy=strategy, use_orig_params=orig)
        sharded = apply_fsdp1(model, init_device_mesh("cpu", (WORLD,)), list(model.layers), cfg, torch.device("cpu"))

        assert max_param_abs_diff(sharded, reference) == 0.0, f"rank {rank}"
        covered += sum(local.numel() for _, local, _ in flat_shard_pairs(sharded, dict(reference.named_parameters())))
        # One element anywhere in the model, here the last, must show up on whichever rank holds it.
        with torch.no_grad():
            reference.layers[-1].out_proj.bias[-1] += 0.5
        after_change.append(max_param_abs_diff(sharded, reference))

    copies = WORLD if strategy == "no_shard" else 1
    assert covered == copies * total, f"compared {covered} of {copies} x {total} elements"
    assert max(after_change) == pytest.approx(0.5, abs=1e-6), after_change
    assert sum(d > 0 for d in after_change) == copies, "the rank holding the element, or every rank under no_shard"
