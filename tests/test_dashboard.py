"""The W&B workspace layout of `python -m fsdp_lab.dashboard`, built and serialized without a network."""

from __future__ import annotations

import json

import wandb_workspaces.reports.v2 as wr

from fsdp_lab.dashboard import workspace_layout
from fsdp_lab.memory_phases import PHASES

PHASE_KEYS = [f"memory/{p}_mib" for p in PHASES]
# What the sink writes: history keys (metrics.jsonl) and summary keys (summary.json nested, or W&B's
# reduction of a history key).
HISTORY_KEYS = {"loss", "parity/loss_abs_diff", "parity/param_max_abs_diff", "memory/peak_mib",
                "perf/step_time_s", "perf/tokens_per_s", "perf/mfu", *PHASE_KEYS}
SUMMARY_KEYS = {"parity.max_loss_abs_diff", "parity.max_param_abs_diff", "memory.peak_mib", "perf.step_time_s",
                "perf.tokens_per_s", *(f"{k}.max" for k in PHASE_KEYS)}


def panel_keys(panel) -> list[str]:
    if isinstance(panel, wr.LinePlot):
        return list(panel.y)
    if isinstance(panel, wr.BarPlot):
        return [m.name for m in panel.metrics]
    if isinstance(panel, wr.ScatterPlot):
        return [panel.x.name, panel.y.name]
    raise AssertionError(f"unexpected panel {panel!r}")


def test_sections_and_their_metric_keys():
    workspace = workspace_layout("team", "fsdp_lab", "2025-01-31/12-00-00-4242")
    sections = {s.name: s.panels for s in workspace.sections}
    assert list(sections) == ["Parity drift", "Memory per phase", "Peak memory", "Throughput", "Loss"]
    keys = {name: [k for p in panels for k in panel_keys(p)] for name, panels in sections.items()}
    assert keys["Parity drift"] == ["parity/loss_abs_diff", "parity/param_max_abs_diff",
                                    "parity.max_loss_abs_diff", "parity.max_param_abs_diff"]
    assert keys["Memory per phase"] == [f"{k}.max" for k in PHASE_KEYS] + PHASE_KEYS
    assert keys["Peak memory"] == ["memory.peak_mib", "perf.step_time_s", "memory.peak_mib", "memory/peak_mib"]
    assert keys["Throughput"] == ["perf.tokens_per_s", "perf/tokens_per_s", "perf/step_time_s", "perf/mfu"]
    assert keys["Loss"] == ["loss"]
    for panels in sections.values():
        for panel in panels:
            if isinstance(panel, wr.LinePlot):
                assert panel.x == "step" and set(panel.y) <= HISTORY_KEYS
            else:
                assert set(panel_keys(panel)) <= SUMMARY_KEYS
    drift = sections["Parity drift"]
    assert drift[0].log_y and drift[1].log_y, "drift spans orders of magnitude"


def test_workspace_shows_only_the_sweeps_runs_and_serializes_offline():
    spec = json.loads(workspace_layout("team", "fsdp_lab", "mesh_study")._to_model().model_dump_json())
    assert (spec["entity"], spec["project"], spec["display_name"]) == ("team", "fsdp_lab", "fsdp_lab sweep mesh_study")
    run_set = spec["spec"]["section"]["run_sets"][0]
    assert run_set["filters"]["filters"] == [
        {"key": {"section": "run", "name": "group"}, "op": "=", "value": "mesh_study", "disabled": False}
    ]
    panels = [p for s in spec["spec"]["section"]["panel_bank_config"]["sections"] for p in s["panels"]]
    assert len(panels) == 13
    scatter = next(p for p in panels if p["view_type"] == "Scatter Plot")
    assert (scatter["config"]["x_axis"], scatter["config"]["y_axis"]) == ("summary:perf.step_time_s", "summary:memory.peak_mib")

