"""`calibrate_device.py --refit` (fsdp_lab/plan/refit.py): a device table's fitted figures again from
its stored measurements by the plan's current trace. The shipped tables must be a fixed point of it:
a change in what the trace records (ops counted, bytes priced) that leaves them unrefitted fails here,
since their figures would divide measured times by another version's counts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmark_scripts import load
from fsdp_lab.plan.refit import refit

DEVICES = Path(__file__).resolve().parent.parent / "fsdp_lab" / "plan" / "devices"


def test_the_shipped_h200_table_is_fitted_by_the_current_trace(tmp_path, monkeypatch):
    shipped = json.loads((DEVICES / "h200.json").read_text())
    table = tmp_path / "h200.json"
    table.write_text(json.dumps(shipped))
    monkeypatch.setattr(sys, "argv", ["calibrate_device.py", "--refit", "--out", str(table)])
    load("calibrate_device").main()
    refitted = json.loads(table.read_text())
    for before, after in zip(shipped["host"]["widths"], refitted["host"]["widths"], strict=True):
        assert after["traced"] == before["traced"], "the trace counts other ops now: run calibrate_device.py --refit"
        assert after["op_s"] == pytest.approx(before["op_s"], rel=1e-9)
        assert after["measured_host_step_s"] == before["measured_host_step_s"], "measurements are kept as measured"
    assert refitted["elementwise"]["eager_factor"] == pytest.approx(shipped["elementwise"]["eager_factor"], rel=1e-6), \
        "the trace prices a block's elementwise ops otherwise now: run calibrate_device.py --refit"
    assert {k: v for k, v in refitted.items() if k not in ("host", "elementwise")} == \
        {k: v for k, v in shipped.items() if k not in ("host", "elementwise")}, "the kernel sections are kept"


def test_a_table_whose_host_widths_are_not_the_calibrations_is_refused():
    table = json.loads((DEVICES / "h200.json").read_text())
    table["host"]["widths"][0]["dim"] = 1000
    with pytest.raises(ValueError, match=r"host widths \[1000, 2304\] are not the calibration's \[768, 2304\]"):
        refit(table)
