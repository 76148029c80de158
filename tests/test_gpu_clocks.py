"""benchmarks/gpu_clocks.py: nvidia-smi's samples read back, and each run's GPUs summarised over its steps."""

from __future__ import annotations

import json
import sys
from datetime import datetime

from benchmark_scripts import load

gpu_clocks = load("gpu_clocks")


def at(clock: str) -> float:
    return datetime.strptime(f"2026/11/28 {clock}", "%Y/%m/%d %H:%M:%S.%f").timestamp()


# Two GPUs, a sample a second: a run from 20:00:01 to 20:00:04, compiling (low power) then steps.
SMI = """\
2026/11/28 20:00:00.100, 0, 345, 80.0, 30, 0x0000000000000001
2026/11/28 20:00:01.100, 0, 1980, 120.5, 31, 0x0000000000000000
2026/11/28 20:00:01.105, 1, 1980, 118.0, 30, 0x0000000000000000
2026/11/28 20:00:02.100, 0, 1700, 640.0, 55, 0x0000000000000004
2026/11/28 20:00:02.105, 1, 1650, 630.0, 57, 0x0000000000000004
2026/11/28 20:00:03.100, 0, 1800, 620.0, 58, 0x0000000000000000
2026/11/28 20:00:03.105, 1, 1750, [N/A], 58, 0x0000000000000004
2026/11/28 20:00:04.100, 0, 1200, 700.0, 60, 0x0000000000000004
"""


def test_a_runs_gpus_are_summarised_over_its_steps_alone(tmp_path):
    (tmp_path / "smi.csv").write_text(SMI)
    samples = gpu_clocks.read(tmp_path / "smi.csv")
    assert len(samples) == 7  # the [N/A] power's line is no sample
    clocks = gpu_clocks.during(samples, at("20:00:01.000"), at("20:00:04.000"))
    # Compiling (under 300 W) and the sample after the run's end are left out.
    assert clocks["gpus"] == {0: {"sm_mhz": 1750, "watts": 630, "max_temp_c": 58.0}, 1: {"sm_mhz": 1650, "watts": 630, "max_temp_c": 57.0}}
    assert clocks["reasons"] == ["0x0000000000000000", "0x0000000000000004"] and clocks["samples"] == 2
    assert gpu_clocks.during(samples, at("20:00:05.000"), at("20:00:06.000")) == {"gpus": {}, "reasons": [], "samples": 0}


def test_the_table_comes_back_from_the_files_in_the_runs_order(tmp_path, monkeypatch, capsys):
    (tmp_path / "smi.csv").write_text(SMI)
    runs = {"lab:b": [{"at": 1, "tokens_per_s": 9000.0, "started": at("20:00:03.000"), "ended": at("20:00:05.000")}],
            "lab:a": [{"at": 0, "tokens_per_s": 10000.0, "started": at("20:00:01.000"), "ended": at("20:00:03.000")}]}
    (tmp_path / "runs.json").write_text(json.dumps({"runs": runs}))
    monkeypatch.setattr(sys, "argv", ["gpu_clocks.py", str(tmp_path / "smi.csv"), str(tmp_path / "runs.json")])
    gpu_clocks.main()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("lab:a") and "GPU 0: 1700 MHz/640 W/55 C  GPU 1: 1650 MHz/630 W/57 C" in out[0]
    assert out[1].startswith("lab:b") and "GPU 0: 1500 MHz/660 W/60 C" in out[1] and "GPU 1" not in out[1]
    assert out[1].endswith("reasons 0x0000000000000000, 0x0000000000000004")
