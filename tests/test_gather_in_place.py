"""fsdp.all_gather=in_place (parallel/gather_in_place.py): each parameter all-gathered straight into its
unsharded storage, no copy-out. Over 4 real gloo ranks every layout FSDP2 gathers in (bf16 parameters,
a first dimension split unevenly, units kept gathered with explicit prefetch, resharded to 2 ranks after
forward under full AC, HSDP, FSDP over tensor parallel) trains bit for bit as with FSDP2's packed
all-gather, every unit's gather in place; the key is set per run and refused off FSDP2 and beside
fsdp.symm_mem."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed.fsdp._fully_shard._fsdp_collectives as fsdp_collectives

from fsdp_lab.config import ConfigError
from fsdp_lab.parallel import gather_in_place
from test_parallelize import TINY, loss_and_grad_norm

RANKS = Path(__file__).resolve().parent / "gather_in_place_ranks.py"


@pytest.mark.slow
def test_every_layout_trains_bit_for_bit_as_with_the_packed_all_gather_every_gather_in_place():
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", str(RANKS)],
                            capture_output=True, text=True, timeout=300, cwd=RANKS.parent.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("REPORT "))[len("REPORT "):])
    assert len(report) == 5
    for name, layout in report.items():
        assert len(layout["rows"]["packed"]) == 3 and layout["rows"]["in_place"] == layout["rows"]["packed"], name
        # Every unit, forward and backward, every step; none of them went to FSDP2's packed path.
        assert layout["gathers"]["in_place"] >= 9 and layout["gathers"]["packed"] == 0, (name, layout["gathers"])


@pytest.mark.parametrize("mode", ["in_place", "packed"])
def test_each_run_sets_the_all_gather_fsdp2_reads(on_one_rank, mode):
    """FSDP2 reads both functions from its param-group module at every unshard; a 1-rank group copies
    its shards without a gather, so the numbers are the same either way."""
    expected = loss_and_grad_norm(*on_one_rank("fsdp.all_gather=packed"))
    assert gather_in_place.fsdp_param_group.foreach_all_gather is fsdp_collectives.foreach_all_gather
    assert loss_and_grad_norm(*on_one_rank(f"fsdp.all_gather={mode}")) == expected
    in_place = gather_in_place.fsdp_param_group.foreach_all_gather is gather_in_place.all_gather_in_place
    assert in_place == (mode == "in_place")
    assert (gather_in_place.fsdp_param_group.foreach_all_gather_copy_out is gather_in_place.copy_out) == in_place


def test_a_custom_all_gather_goes_to_fsdp2s_own():
    """symmetric memory's all-gather allocates its own output, so the unit is FSDP2's to gather."""
    class Shard0:
        fsdp_placement = type("Placement", (), {"dim": 0})()

    assert gather_in_place.takes([Shard0()], fsdp_collectives.DefaultAllGather())
    assert not gather_in_place.takes([Shard0()], object())
    dim1 = Shard0()
    dim1.fsdp_placement = type("Placement", (), {"dim": 1})()
    assert not gather_in_place.takes([Shard0(), dim1], fsdp_collectives.DefaultAllGather())


@pytest.mark.bad_input
def test_the_key_is_refused_off_fsdp2_beside_symm_mem_and_outside_its_values(prepared):
    with pytest.raises(ConfigError, match=r"fsdp\.all_gather=in_place.*fsdp2"):
        prepared(*TINY, "mesh=ddp", "fsdp.all_gather=in_place")
    with pytest.raises(ConfigError, match=r"^fsdp\.all_gather=in_place with fsdp\.symm_mem=true: .*allowed"):
        prepared(*TINY, "fsdp.all_gather=in_place", "fsdp.symm_mem=true")
    with pytest.raises(ConfigError, match=r"fsdp\.all_gather.*flat.*packed.*in_place"):
        prepared(*TINY, "fsdp.all_gather=flat")
