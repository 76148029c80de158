"""The plan's traces (fsdp_lab.plan.trace.trace_step) shared between the tests of a module: a trace is
a function of its run, depth, batch and AC mode alone (no device, no table, nothing of plan.*: it runs
the run as mode=estimate), so a run traced again records the same ops; tests that refit or price
several tables of one model, or plan it for other GPUs, trace it once. The shared traces live in this
process, so within them the plan traces here: under plan.workers=0 a slow machine's first trace can make
a pool look faster (fsdp_lab/plan/side_by_side.py), and a pool's processes cannot take this module's
closure (it does not pickle; a 2-core CI run failed so, 2026-11-28)."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from unittest import mock

import fsdp_lab.plan.predict
import fsdp_lab.plan.side_by_side
import fsdp_lab.plan.trace


@contextmanager
def traces_shared():
    """Within: each (run, layers, batch, ac) traced once, wherever the plan's code traces it."""
    trace_step = fsdp_lab.plan.trace.trace_step
    traced = {}

    def shared(run, layers, batch, ac):
        key = repr((dataclasses.replace(run, plan=None), layers, batch, ac))
        if key not in traced:
            traced[key] = trace_step(run, layers=layers, batch=batch, ac=ac)
        return traced[key]

    with (mock.patch.object(fsdp_lab.plan.trace, "trace_step", shared), mock.patch.object(fsdp_lab.plan.predict, "trace_step", shared),
          mock.patch.object(fsdp_lab.plan.side_by_side, "pool_gains", lambda *_: False)):
        yield
