"""Runs checked against DDP: the odd-sized MLP stack (dim 17: uneven shards) with SGD+momentum
(exposes gradient-averaging bugs that Adam's scale invariance hides), and the verdict such a run
must reach. Shared by the mesh and engine tests."""

from __future__ import annotations

PARITY_RUN = ("model=mlp_stack", "optim=sgd", "train.steps=6", "probes.parity.param_every=3", "probes.memory.enabled=false", "logger=none")
FSDP1 = ("mesh.engine=fsdp1",)


def assert_parity_ok(result, tolerance: float = 1e-5) -> dict:
    """A PARITY_RUN that ended ok within `tolerance` of DDP, parameters compared at steps 3 and 6."""
    assert result.returncode == 0, result.stderr[-3000:]
    s = result.summary
    p = s["parity"]
    assert s["status"] == "ok" and s["steps"] == 6
    assert p["ok"] and p["tolerance"] == tolerance
    assert p["max_loss_abs_diff"] <= tolerance and p["max_param_abs_diff"] <= tolerance, p
    assert sum("parity/param_max_abs_diff" in r for r in result.metrics) == 2, "parameters compared at steps 3 and 6"
    return s


def fsdp1_strategy_line(result) -> str:
    """The strategy FSDP1 was given, from the rank's `fsdp1: ...` log line."""
    return next(line for line in (result.stdout + result.stderr).splitlines() if "fsdp1: " in line)
