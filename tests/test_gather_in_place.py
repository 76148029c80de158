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


@pytest.fixture(autouse=True)
def packed_after():
    """FSDP2's own gather again after each test, for the tests that shard without the lab's build."""
    yield
    gather_in_place.use("packed")


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


def test_the_gathers_wait_for_the_copy_in_and_never_for_the_compute_stream(on_one_rank):
    """Forward issues a unit's gather while the unit ahead still runs: a gather that waited for the compute
    stream would run only after it. Called on a 1-rank unit's parameters (FSDP2 itself skips the gather
    on one rank) with streams that record what they wait for: the gathers' stream waits for the copy-in's
    alone, and each parameter comes out gathered."""
    import torch
    import torch.distributed as dist

    from fsdp_lab.parallel.fsdp2 import param_groups

    class Recording(torch.cpu.Stream):
        def __init__(self, name: str):
            super().__init__()
            self.name, self.waited = name, []

        def wait_stream(self, stream) -> None:
            self.waited.append(getattr(stream, "name", "compute"))

    run, model = on_one_rank("fsdp.all_gather=in_place")
    loss_and_grad_norm(run, model)  # FSDP2's lazy init: each parameter's dtypes; the units resharded after
    fsdp_params = param_groups(model.layers[0]._get_fsdp_state())[0].fsdp_params
    copy_in, gathers = Recording("copy-in"), Recording("gathers")
    result = gather_in_place.all_gather_in_place(fsdp_params, dist.group.WORLD, False, copy_in, gathers, torch.device("cpu"),
                                                 fsdp_collectives.DefaultAllGather())
    gather_in_place.copy_out(result, fsdp_params, dist.group.WORLD)
    assert isinstance(result, gather_in_place.GatheredInPlace) and gathers.waited == ["copy-in"] and copy_in.waited == []
    for fsdp_param in fsdp_params:
        shard = fsdp_param._sharded_param_data
        assert torch.equal(fsdp_param.all_gather_outputs[0], shard.to(fsdp_param.all_gather_outputs[0].dtype))


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


def test_the_estimate_and_the_plans_trace_run_the_gather_in_place(prepared):
    """Traced on a fake group under FakeTensorMode and FSDPMemTracker, as mode=estimate and mode=plan
    trace (c10d has no fake coalesced gather; the tracker checks a gathered tensor's output is a buffer it
    saw allocated): the in-place gathers are traced, the same ops recorded and the peak within 0.1% of
    FSDP2's packed gather (FSDP2's copy-out is an fsdp:: op, which the plan's trace does not price)."""
    from fsdp_lab.plan.trace import trace_step

    traces, gathers = {}, []
    lab_gather = gather_in_place.all_gather_in_place
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gather_in_place, "all_gather_in_place", lambda *args: gathers.append(1) or lab_gather(*args))
        for mode in ("packed", "in_place"):
            run, _ = prepared(*TINY, "mesh.dp_shard=2", "model.dim=64", "model.n_layers=3", "fsdp.param_dtype=bfloat16",
                              f"fsdp.all_gather={mode}")
            traces[mode] = trace_step(run, layers=None, batch=2, ac="none")
    assert len(gathers) >= 8  # 4 units in forward and again in backward
    assert [op.name for op in traces["in_place"].ops] == [op.name for op in traces["packed"].ops]
    assert traces["in_place"].peak_bytes == pytest.approx(traces["packed"].peak_bytes, rel=1e-3)
