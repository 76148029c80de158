"""The FSDP1 parity probe compares each rank's flat shard with the right slices of the reference:
real FSDP1 on 2 gloo ranks, odd-sized MLPs (uneven shards, padding), every strategy that shards
differently, with and without use_orig_params (which adds alignment padding inside the shard)."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh

from fsdp_lab.config import FSDPConfig
from fsdp_lab.models.mlp import MLPStack
from fsdp_lab.parallel.fsdp1 import apply_fsdp1
from fsdp_lab.probes.flat_shards import flat_shard_pairs
from fsdp_lab.probes.parity import max_param_abs_diff

pytestmark = pytest.mark.slow

WORLD = 2
CASES = list(itertools.product(("full_shard", "shard_grad_op", "no_shard"), (False, True)))


def _check_all_cases(rank: int, store_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    for strategy, orig in CASES:
        torch.manual_seed(0)
        model = MLPStack(17, 51, 3)
        reference = copy.deepcopy(model)
        total = sum(p.numel() for p in model.parameters())
        cfg = FSDPConfig(sharding_strategy=strategy, use_orig_params=orig)
        sharded = apply_fsdp1(model, mesh, list(model.layers), cfg, torch.device("cpu"))
        case = f"{strategy}, use_orig_params={orig}"

        assert max_param_abs_diff(sharded, reference) == 0.0, case
        ref_params = dict(reference.named_parameters())
        covered = torch.tensor(sum(local.numel() for local, _ in flat_shard_pairs(sharded, ref_params)))
        dist.all_reduce(covered)
        copies = WORLD if strategy == "no_shard" else 1
        assert covered.item() == copies * total, f"{case}: compared {covered.item()} of {copies} x {total} elements"

        # One element anywhere in the model, here the last, must show up on whichever rank holds it.
        with torch.no_grad():
            reference.layers[-1].out_proj.bias[-1] += 0.5
        assert abs(max_param_abs_diff(sharded, reference) - 0.5) < 1e-6, case
    dist.destroy_process_group()


def test_flat_shards_cover_every_element_and_match_the_reference(tmp_path):
    mp.spawn(_check_all_cases, args=(str(tmp_path / "store"),), nprocs=WORLD, join=True)
