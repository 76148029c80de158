"""Gradient accumulation under HSDP: every policy matches DDP accumulating the same microbatches,
and the collective counts differ as each policy promises."""

from __future__ import annotations

import json

import pytest

from warm_lab import run_lab_warm

pytestmark = pytest.mark.slow

QUICK = ("train.steps=2", "logger=none", "probes.memory.enabled=false", "model.n_layers=2")
UNITS = 3  # two blocks + the root


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The documented sweep over sync policies (reshard_after_backward=true, the default; false covered below)."""
    sweep_dir = tmp_path_factory.mktemp("accum")
    result = run_lab_warm("-m", "+experiment=hsdp_accum", "train.accum.sync=every,last,reduce_scatter_only", *QUICK,
                     f"hydra.sweep.dir={sweep_dir}", "hydra.launcher.max_ranks=4", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {}
    for job in sorted(p for p in sweep_dir.iterdir() if p.is_dir()):
        overrides = (job / ".hydra" / "overrides.yaml").read_text()
        sync = next(s for s in ("reduce_scatter_only", "every", "last") if f"sync={s}" in overrides)
        rows[sync] = (json.loads((job / "summary.json").read_text()), [json.loads(l) for l in (job / "metrics.jsonl").open()])
    return rows


def test_every_policy_matches_ddp(sweep):
    assert set(sweep) == {"every", "last", "reduce_scatter_only"}
    for summary, _ in sweep.values():
        assert summary["status"] == "ok" and summary["world_size"] == 4
        assert summary["mesh"]["dp_replicate"] == 2 and summary["mesh"]["dp_shard"] == 2
        assert summary["parity"]["ok"] and summary["parity"]["max_loss_abs_diff"] <= 1e-5


def test_comm_counts_follow_the_policy(sweep):
    every, last, rs_only = (sweep[k][1][-1] for k in ("every", "last", "reduce_scatter_only"))
    microbatches = 3
    # every: each microbatch reduce-scatters within the replica and all-reduces across replicas
    assert every["comm/reduce_scatter_count"] == every["comm/all_reduce_count"] == microbatches * UNITS
    # last: nothing is reduced before the last microbatch
    assert last["comm/reduce_scatter_count"] == last["comm/all_reduce_count"] == UNITS
    # reduce_scatter_only: reduce-scatter every microbatch, all-reduce across replicas only on the last
    assert rs_only["comm/reduce_scatter_count"] == microbatches * UNITS and rs_only["comm/all_reduce_count"] == UNITS
    assert every["comm/all_gather_count"] == last["comm/all_gather_count"]


def test_keeping_parameters_unsharded_between_microbatches_saves_all_gathers(sweep, tmp_path):
    # The sweep's sync=last job is the experiment's default, resharding after backward.
    counts = {"reshard": sweep["last"][1][-1]["comm/all_gather_count"]}
    for name, overrides in {
        "keep": ("train.accum.reshard_after_backward=false",),
        "keep_explicit": ("train.accum.reshard_after_backward=false", "train.accum.explicit_unshard=true"),
    }.items():
        result = run_lab_warm("+experiment=hsdp_accum", *QUICK, *overrides, run_dir=tmp_path / name)
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.summary["parity"]["ok"]
        counts[name] = result.metrics[-1]["comm/all_gather_count"]
    assert counts["keep"] < counts["reshard"]
    assert counts["keep_explicit"] == counts["keep"], "explicit unshard issues the same all-gathers, earlier"


@pytest.mark.parametrize("engine_overrides", [("mesh.engine=ddp",)])
def test_ddp_no_sync_accumulation_matches_the_reference(tmp_path, engine_overrides):
    result = run_lab_warm("train.steps=3", "logger=none", "probes.memory.enabled=false", "train.microbatches=2",
                     "train.accum.sync=last", "probes.comm.enabled=true", *engine_overrides, run_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.summary["parity"]["ok"] and result.summary["parity"]["max_loss_abs_diff"] <= 1e-5
    assert result.metrics[-1]["comm/all_reduce_count"] >= 1
