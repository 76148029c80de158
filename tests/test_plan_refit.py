"""`calibrate_device.py --refit` (fsdp_lab/calibrate/refit.py): a device table's fitted figures again from
its stored measurements by the plan's current trace. The shipped tables must be a fixed point of it:
a change in what the trace records (ops counted, bytes priced) that leaves them unrefitted fails here,
since their figures would divide measured times by another version's counts."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch

from benchmark_scripts import load
from device_tables import host_sections
from fsdp_lab.calibrate.refit import refit
from fsdp_lab.plan.trace import traced_on
from shared_traces import traces_shared

DEVICES = Path(__file__).resolve().parent.parent / "fsdp_lab" / "plan" / "devices"


@pytest.fixture(scope="module", autouse=True)
def one_trace_per_model():
    """The refits of this module trace the calibration's models once (shared_traces.py)."""
    with traces_shared():
        yield


def skip_unless_fitted_by_this_torch(table: dict) -> None:
    """A table's fitted figures are a fixed point of the trace of the torch that fitted them (torch 2.11
    and 2.13 dispatch other ops): on another, a refit changes them all."""
    widths = [w for section in host_sections(table["host"]) for w in section["widths"]]
    versions = {s["traced_on"] for s in (*widths, *([table["elementwise"]] if "elementwise" in table else []))}
    if any(v.split(" ")[1].split(".")[:2] != torch.__version__.split(".")[:2] for v in versions):
        pytest.skip(f"the table was fitted by the trace of {versions}, which counts other ops than this torch's: refit it here to check it")


def shipped_h200() -> dict:
    return json.loads((DEVICES / "h200.json").read_text())


def changed(before, after, at: str = "") -> list[str]:
    """The places where `after` differs from `before`: every key and list item, numbers to 9
    significant digits (a refit recomputes them in another order of float operations)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [p for k in before.keys() | after.keys() for p in changed(before.get(k), after.get(k), f"{at}.{k}")]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [p for i, (b, a) in enumerate(zip(before, after)) for p in changed(b, a, f"{at}.{i}")]
    if isinstance(before, float) and isinstance(after, float):
        return [] if f"{before:.9g}" == f"{after:.9g}" else [at]
    return [] if before == after else [at]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["h200", "h100-80gb"])
def test_the_shipped_tables_are_fitted_by_the_current_trace(name, tmp_path, monkeypatch):
    shipped = json.loads((DEVICES / f"{name}.json").read_text())
    skip_unless_fitted_by_this_torch(shipped)
    table = tmp_path / f"{name}.json"
    table.write_text(json.dumps(shipped))
    monkeypatch.setattr(sys, "argv", ["calibrate_device.py", "--refit", "--out", str(table)])
    load("calibrate_device").main()
    assert changed(shipped, json.loads(table.read_text())) == [], \
        "the trace counts or prices a block otherwise now: run calibrate_device.py --refit"


@pytest.mark.slow
def test_a_figure_left_stale_anywhere_is_seen_and_measurements_and_provenance_stay():
    """The fixed-point check sees a figure the refit fits again wherever it is: the host's per-width
    figures, the block's kernel time the host is read at, a measured block's pricing."""
    stale = shipped_h200()
    skip_unless_fitted_by_this_torch(stale)  # else the refit changes every fitted figure
    stale["host"]["widths"][0]["block_kernel_s"] *= 1.1
    stale["host"]["widths"][1]["step_s"] *= 1.1
    stale["elementwise"]["blocks"][1]["priced_elementwise_s"] *= 1.1
    stale["host"]["widths"][0]["traced_on"] = "torch 0.0"
    expected = {".host.widths.0.block_kernel_s", ".host.widths.1.step_s", ".elementwise.blocks.1.priced_elementwise_s", ".host.widths.0.traced_on"}
    refitted = refit(stale)
    assert set(changed(stale, refitted)) == expected
    assert refitted["host"]["widths"][0]["traced_on"] == traced_on()


@pytest.mark.slow
def test_a_table_of_several_rank_counts_has_each_count_s_section_refitted():
    """A host section per rank count: each fitted again as a table of that section alone would be."""
    table = shipped_h200()
    stale = copy.deepcopy(table["host"])
    stale["widths"][1]["op_s"] *= 1.1
    by_gpus = {**table, "host": {"by_gpus": {"2": table["host"], "4": stale}}}
    refitted = refit(by_gpus)["host"]["by_gpus"]
    alone = refit(table)["host"]
    assert changed(alone, refitted["2"]) == [] and changed(alone, refitted["4"]) == []


def test_a_table_whose_host_widths_are_not_the_calibrations_is_refused():
    table = shipped_h200()
    table["host"]["widths"][0]["dim"] = 1000
    with pytest.raises(ValueError, match=r"host widths \[1000, 2304\] are not the calibration's \[768, 2304\]"):
        refit(table)


def test_an_older_one_width_host_section_is_refused_not_passed_as_refitted(tmp_path, monkeypatch, capsys):
    """An older host section (one GPU's runs at depths 2 and 6 of a model whose shape it does not store,
    as h100-80gb's was until 2026-11-27) cannot be traced again: --refit says so in one line and exits
    2, the table untouched."""
    older = {**json.loads((DEVICES / "h200.json").read_text()),
             "host": {"op_s": 7.8e-6, "step_s": 0.0, "measured_step_s": {"eager 2": 0.012, "eager 6": 0.035}}}
    table = tmp_path / "h100-80gb.json"
    table.write_text(json.dumps(older))
    monkeypatch.setattr(sys, "argv", ["calibrate_device.py", "--refit", "--out", str(table)])
    with pytest.raises(SystemExit) as exit:
        load("calibrate_device").main()
    assert exit.value.code == 2 and json.loads(table.read_text()) == older
    err = capsys.readouterr().err
    assert "error: --refit" in err and "older one of one width" in err
