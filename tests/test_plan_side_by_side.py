"""plan.workers: the plan's traces side by side in spawned processes give the figures the plan takes
in one process, a pool starts only where it is predicted to finish first, and one pool serves a whole
plan (fsdp_lab/plan/side_by_side.py)."""

from __future__ import annotations

import os
import time
from unittest import mock

import pytest

from fsdp_lab.compose import compose_run
from fsdp_lab.config import ConfigError
from fsdp_lab.plan.run import plan
from fsdp_lab.plan.side_by_side import POOL_START_S, SideBySide, pool_gains


def test_a_pool_starts_only_where_it_finishes_first():
    assert not pool_gains(first_s=0.01, rest=15, cpus=16)  # a tiny model's traces: the start would cost more
    assert pool_gains(first_s=2.0, rest=15, cpus=16)  # an 8B float8 trace
    assert not pool_gains(first_s=2.0, rest=15, cpus=1) and not pool_gains(first_s=2.0, rest=1, cpus=16)
    slow_enough = POOL_START_S / 2 + 0.01  # 4 traces on 2 CPUs: the start and 2 traces against 4
    assert pool_gains(first_s=slow_enough, rest=4, cpus=2) and not pool_gains(first_s=slow_enough - 0.02, rest=4, cpus=2)


def test_fast_calls_stay_in_this_process():
    """Under plan.workers=0 the calls run here, in order, the first ones before any pool is considered (the
    fast tier refuses a started process, and holds the timing rule, tested above, to no pool: tests/tiers.py)."""
    with SideBySide(0) as side:
        assert side.map(os.getpid, [()] * 5) == [os.getpid()] * 5
        assert side.map(os.getpid, [()] * 5) == [os.getpid()] * 5  # warm now: its first call here timed the rest


def _sleep_then_pid(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


@pytest.mark.slow
def test_the_first_warm_call_times_the_rest():
    """The process's first call pays its imports, so the next one times the rest: here calls slow
    enough for a pool (a start of 0.2 s against 0.3 s a call) go to one only after two ran here."""
    with mock.patch("fsdp_lab.plan.side_by_side.POOL_START_S", 0.2), mock.patch("fsdp_lab.plan.side_by_side.usable_cpus", return_value=2), \
            SideBySide(0) as side:
        pids = side.map(_sleep_then_pid, [(0.3,)] * 4)
    assert pids[:2] == [os.getpid()] * 2 and os.getpid() not in pids[2:]


@pytest.mark.slow
def test_calls_run_in_one_pool_in_order_and_a_dying_process_is_one_line():
    with SideBySide(2) as side:
        pids = [pid for _ in range(3) for pid in side.map(os.getpid, [()] * 2)]
        assert os.getpid() not in pids
        assert len(set(pids)) <= 2  # three batches, one pool of two processes: its start paid once
        assert side.map(divmod, [(7, 2), (9, 4), (5, 5)]) == [(3, 1), (2, 1), (1, 0)]
    with pytest.raises(ConfigError, match=r"^plan\.workers: one of 2 tracing processes died .*plan\.workers=1"), SideBySide(2) as side:
        side.map(os._exit, [(1,), (1,)])


def test_a_plans_cost_traces_and_estimates_go_through_its_one_pool():
    """rank() opens one SideBySide and sends it both kinds of trace, the cost model's all at once."""
    maps = []
    real_map = SideBySide.map

    def recorded(side, fn, calls):
        maps.append((id(side), fn.__name__, len(calls)))
        return real_map(side, fn, calls)

    args = ("model.dim=32", "model.n_layers=4", "model.n_heads=4", "model.ffn_dim=64", "model.vocab_size=128", "train.seq_len=16",
            "mode=plan", "plan.gpus=4", "plan.gpus_per_node=4", "plan.device=h100-80gb", "plan.top=6", "plan.workers=1", "logger=none")
    with mock.patch.object(SideBySide, "map", recorded):
        plan(compose_run(*args))
    assert maps[0][1:] == ("trace_step", 8)  # every cost trace (2 AC modes x 4 shapes) in one batch, first
    assert {name for _, name, _ in maps} == {"trace_step", "estimated_peak_mib"}
    assert len({side for side, _, _ in maps}) == 1  # a trace taken lazily (Predictor.model) would map through another


@pytest.mark.slow
def test_a_plan_traced_side_by_side_is_the_plan_traced_here():
    args = ("model.dim=32", "model.n_layers=4", "model.n_heads=4", "model.ffn_dim=64", "model.vocab_size=128", "train.seq_len=16",
            "mode=plan", "plan.gpus=4", "plan.gpus_per_node=4", "plan.device=h100-80gb", "plan.top=6", "logger=none")
    rows = {}
    for workers in (1, 3):
        candidates, _ = plan(compose_run(*args, f"plan.workers={workers}"))
        rows[workers] = [c.row() for c in candidates]
    shown = [r for r in rows[1][:6] if r["memory_from"] == "estimate"]
    assert len({r["peak_mib"] for r in shown}) > 1  # several estimates taken, so the pool had work
    assert rows[3] == rows[1]
