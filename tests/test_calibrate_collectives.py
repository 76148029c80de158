"""A device table's collectives at several GPU counts: `calibrate_device.py --collectives-only` over
real gloo ranks puts its rows beside the table's rows of other counts, and the plan prices a group by
the rows of the nearest count (NCCL's latency and bus bandwidth change with the ranks of a ring)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fsdp_lab.plan.device import fit_nearest_group

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "calibrate_device.py"


def rows(group: int, latency: float, gbps: float) -> list[dict]:
    """Rows timed exactly as t = latency * log2(group) + ring factor * bytes / bandwidth."""
    def t(factor, mib):
        return latency * (group.bit_length() - 1) + factor * (group - 1) / group * mib * 2**20 / (gbps * 1e9)
    return [{"mib": mib, "group": group, "all_gather_s": t(1, mib), "reduce_scatter_s": t(1, mib), "all_reduce_s": t(2, mib)}
            for mib in (1, 8, 64, 256)]


def test_a_group_is_priced_by_the_rows_of_the_nearest_measured_count():
    table = rows(2, 2e-5, 300) + rows(4, 5e-5, 150)
    assert fit_nearest_group(table, "all_gather", 2) == pytest.approx((2e-5, 300e9), rel=1e-6)
    assert fit_nearest_group(table, "all_gather", 4) == pytest.approx((5e-5, 150e9), rel=1e-6)
    assert fit_nearest_group(table, "all_reduce", 8) == pytest.approx((5e-5, 150e9), rel=1e-6)  # 4 is nearest to 8
    assert fit_nearest_group(rows(2, 2e-5, 300), "reduce_scatter", 8) == pytest.approx((2e-5, 300e9), rel=1e-6)


@pytest.mark.slow
def test_collectives_only_keeps_the_rows_of_another_gpu_count(tmp_path):
    out = tmp_path / "table.json"
    other = rows(4, 5e-5, 150)
    out.write_text(json.dumps({"name": "cpu", "spec": {"memory_gib": 1}, "collectives": {"intra_node": other}}))
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT),
                    "--collectives-only", "--out", str(out)], check=True, capture_output=True, timeout=120)
    table = json.loads(out.read_text())
    section = table["collectives"]
    assert [r for r in section["intra_node"] if r["group"] == 4] == other
    measured = [r for r in section["intra_node"] if r["group"] == 2]
    assert [r["mib"] for r in measured] == [1, 2] and all(r["all_reduce_s"] > 0 for r in measured)
    assert set(section["measured_on"]) == {"2"} and table["spec"] == {"memory_gib": 1}
