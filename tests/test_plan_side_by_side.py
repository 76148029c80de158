"""plan.workers: the plan's traces side by side in spawned processes give the figures the plan takes
in one process, and a pool starts only where it is predicted to finish first (fsdp_lab/plan/side_by_side.py)."""

from __future__ import annotations

import os

import pytest

from fsdp_lab.compose import compose_run
from fsdp_lab.config import ConfigError
from fsdp_lab.plan.run import plan
from fsdp_lab.plan.side_by_side import POOL_START_S, pool_size, side_by_side


def test_a_pool_starts_only_where_it_finishes_first():
    assert pool_size(first_s=0.01, rest=15, cpus=16) == 1  # a tiny model's traces: the start would cost more
    assert pool_size(first_s=2.0, rest=15, cpus=16) == 15  # an 8B float8 trace: one process each
    assert pool_size(first_s=2.0, rest=40, cpus=16) == 16  # never more than the CPUs
    assert pool_size(first_s=2.0, rest=15, cpus=1) == 1
    slow_enough = POOL_START_S / 2 + 0.01  # 4 traces on 2 CPUs: the start and 2 traces against 4
    assert pool_size(first_s=slow_enough, rest=4, cpus=2) == 2 and pool_size(first_s=slow_enough - 0.02, rest=4, cpus=2) == 1


def test_fast_calls_stay_in_this_process():
    """Under plan.workers=0 calls this fast never start a pool (the fast tier refuses a started process)."""
    assert side_by_side(os.getpid, [()] * 5, workers=0) == [os.getpid()] * 5


@pytest.mark.slow
def test_calls_run_in_the_pool_in_order_and_a_dying_process_is_one_line():
    pids = side_by_side(os.getpid, [()] * 4, workers=2)
    assert len(pids) == 4 and os.getpid() not in pids  # in the pool's processes (one may take them all)
    assert side_by_side(divmod, [(7, 2), (9, 4), (5, 5)], workers=2) == [(3, 1), (2, 1), (1, 0)]
    with pytest.raises(ConfigError, match=r"^plan\.workers: one of 2 tracing processes died .*plan\.workers=1"):
        side_by_side(os._exit, [(1,), (1,)], workers=2)


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
