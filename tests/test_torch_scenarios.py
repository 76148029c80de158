"""PyTorch's FSDP test scenarios as experiments (conf/experiment/torch_*.yaml): the documented sweep
over all of them runs every one, and every verdict it selected holds on this machine."""

from __future__ import annotations

import json

import pytest
import yaml

from fsdp_lab.cli_process import REPO
from warm_lab import run_lab_warm

pytestmark = pytest.mark.slow

EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("torch_*.yaml"))
# Figures only a GPU can give: on CPU their verdict is n/a (ok null), never false.
GPU_ONLY = {"tracker_accuracy"}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, tuple[dict, list[dict]]]:
    sweep_dir = tmp_path_factory.mktemp("torch_scenarios")
    result = run_lab_warm("-m", "+experiment=glob(torch_*)", "train.steps=3", "logger=none", "hydra.launcher.max_ranks=4",
                     f"hydra.sweep.dir={sweep_dir}", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    out = {}
    for job in (p for p in sweep_dir.iterdir() if p.is_dir()):
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
        experiment = next(o.split("=", 1)[1] for o in overrides if o.startswith("+experiment="))
        rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
        out[experiment] = (json.loads((job / "summary.json").read_text()), rows)
    return out


def test_the_sweep_runs_every_torch_experiment(jobs):
    assert sorted(jobs) == EXPERIMENTS and len(EXPERIMENTS) >= 10
    for name, (summary, _) in jobs.items():
        assert summary["status"] == "ok", (name, summary["error"])
        assert summary["checks"], name


def test_every_verdict_holds(jobs):
    failed = {
        (name, spec): v for name, (summary, _) in jobs.items() for spec, v in summary["checks"].items()
        if not (v["ok"] is True or (v["ok"] is None and spec in GPU_ONLY))
    }
    assert not failed


def test_checkpointing_the_blocks_lowers_memory_after_forward(jobs):
    """test_fsdp_memory's checkpoint=True case: activations of the conv blocks are not kept."""
    plain, with_ac = (jobs[name][0]["memory"]["phases_max_mib"]["after_fwd"] for name in ("torch_fsdp_memory", "torch_fsdp_memory_ac"))
    assert with_ac < plain


def test_fine_tuning_freezes_what_the_pattern_names(jobs):
    for name in ("torch_fine_tune", "torch_fine_tune_mixed"):
        frozen = jobs[name][0]["frozen"]
        assert frozen["params"] == 6 and frozen["compared_numel"] > 0  # in_proj weight + bias of 3 MLPs
