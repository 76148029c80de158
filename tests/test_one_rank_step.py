"""benchmarks/one_rank_step.py on the CPU: rank 0 of a 4-rank layout in torch's fake process group, the
variants alternated in fresh processes; the table names, for each variant, the variants whose losses
its runs matched step for step (FSDP2's packed gather and the in-place one compute the same numbers,
another seed does not; on torch 2.11, whose fake reduce-scatter writes nothing, the first step alone), and
--json keeps every run's figures and losses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_one_rank_of_four_runs_each_variant_and_says_which_compute_the_same(tmp_path):
    out = tmp_path / "runs.json"
    result = subprocess.run(
        [sys.executable, "benchmarks/one_rank_step.py", "--world", "4", "--runs", "1", "--json", str(out),
         "--variant", "packed=", "--variant", "in_place=fsdp.all_gather=in_place", "--variant", "seed=train.seed=1",
         "--", "debug=cpu_tiny", "mesh.dp_shard=4", "train.steps=3"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line.split("|")[-2].strip() for line in result.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| variant")}
    assert rows == {"packed": "packed, in_place", "in_place": "packed, in_place", "seed": "seed"}
    runs = json.loads(out.read_text())["runs"]
    assert {name: len(r) for name, r in runs.items()} == {"packed": 1, "in_place": 1, "seed": 1}
    assert all(len(r[0]["losses"]) == 3 and r[0]["world"] == 4 and r[0]["step_time_s"] > 0 for r in runs.values())


@pytest.mark.slow
def test_a_layout_that_does_not_fill_the_world_is_refused():
    result = subprocess.run([sys.executable, "benchmarks/one_rank_step.py", "--one-run", "--world", "4", "--",
                             "debug=cpu_tiny", "mesh.dp_shard=2"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "the layout's world is 2 ranks, not --world 4" in result.stderr
