"""A device table's `sustained` section (fsdp_lab/calibrate/sustained.py, written by
`calibrate_device.py`): what the GPUs held of their burst matmul rate under their power limit, from
every rank's bursts and held seconds, and the refusal where there is no GPU to hold it."""

from __future__ import annotations

import sys

import pytest

from benchmark_scripts import load
from fsdp_lab.calibrate.sustained import sustained_section
from fsdp_lab.plan.device import Device, load_device


def rank(bursts: list[int], held: list[int], mhz=(1470, 1710), watts=(682, 701)) -> dict:
    shapes = ("4096x4096x4096", "4096x14336x4096", "4096x4096x14336", "14336x4096x4096")
    return {"bursts": dict(zip(shapes, bursts)),
            "seconds": [{"tflops": t, "sm_mhz": mhz[i % 2], "watts": watts[i % 2]} for i, t in enumerate(held)]}


def test_the_fraction_is_each_ranks_held_rate_over_its_bursts_averaged_over_ranks():
    ranks = [rank([800, 800, 800, 800], [680, 680, 680]),  # 0.85
             rank([700, 700, 700, 700], [560, 560, 560])]  # 0.80
    section = sustained_section(ranks, "NVIDIA H200", 15)
    assert section["by_rank"] == [0.85, 0.8]
    assert section["matmul_fraction"] == 0.825
    assert "NVIDIA H200 x2" in section["source"]
    for says in ("700-800 TFLOP/s in bursts of 20 calls", "560-680 TFLOP/s back to back for 15 s", "1470-1710 MHz", "682-701 W"):
        assert says in section["source"]


def test_a_ranks_fraction_is_over_its_mean_burst_not_its_fastest_shape():
    section = sustained_section([rank([790, 800, 810, 800], [640, 680])], "gpu", 2)
    assert section["by_rank"] == [0.825]  # 660 over 800


def test_the_plan_prices_matmuls_at_the_section_calibrate_writes():
    table = {k: v for k, v in load_device("h200").table.items() if k != "sustained"}
    section = sustained_section([rank([800] * 4, [600, 600])], "NVIDIA H200", 2)
    bursts, held = Device("h200", table), Device("h200", {**table, "sustained": section})
    assert held.matmul_s(4096, 4096, 4096, "bfloat16") == pytest.approx(bursts.matmul_s(4096, 4096, 4096, "bfloat16") / 0.75)


def test_sustained_only_without_a_gpu_is_refused_in_one_line_and_the_table_is_untouched(tmp_path, monkeypatch, capsys):
    table = tmp_path / "t.json"
    table.write_text('{"name": "x"}')
    monkeypatch.setattr(sys, "argv", ["calibrate_device.py", "--sustained-only", "--out", str(table)])
    with pytest.raises(SystemExit) as exit:
        load("calibrate_device").main()
    assert exit.value.code == 2
    assert "--sustained-only: no GPU here" in capsys.readouterr().err
    assert table.read_text() == '{"name": "x"}'
