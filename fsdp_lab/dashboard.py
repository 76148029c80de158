"""A W&B workspace for one sweep (a W&B group): parity drift, memory per phase, peak memory and
throughput of every job side by side.

    python -m fsdp_lab.dashboard --project fsdp_lab --group 2025-01-31/12-00-00-4242 [--entity TEAM]

`workspace_layout` builds the whole layout without touching the network; only saving it talks to W&B.
Line plots read the history (metric keys of metrics.jsonl against `step`); bars and the scatter read
each run's summary: the nested keys of summary.json (`memory.peak_mib`, `perf.step_time_s`, ...)
and W&B's reductions of the history (`memory/<phase>_mib.max`)."""

from __future__ import annotations

import argparse
import sys

import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws

from fsdp_lab.memory_phases import PHASES


def _lines(title: str, *keys: str, log_y: bool = False) -> wr.LinePlot:
    return wr.LinePlot(title=title, x="step", y=list(keys), log_y=log_y)


def _bars(title: str, *summary_keys: str) -> wr.BarPlot:
    return wr.BarPlot(title=title, metrics=[wr.SummaryMetric(k) for k in summary_keys], orientation="v")


def workspace_sections() -> list[ws.Section]:
    phases = [f"memory/{p}_mib" for p in PHASES]
    return [
        ws.Section(name="Parity drift", is_open=True, panels=[
            _lines("Loss |Δ| vs reference", "parity/loss_abs_diff", log_y=True),
            _lines("Parameter max |Δ| vs reference", "parity/param_max_abs_diff", log_y=True),
            _bars("Worst drift", "parity.max_loss_abs_diff", "parity.max_param_abs_diff"),
        ]),
        ws.Section(name="Memory per phase", is_open=True, panels=[
            _bars("Memory per phase (max over steps, MiB)", *(f"{k}.max" for k in phases)),
            _lines("Memory per phase over steps (MiB)", *phases),
        ]),
        ws.Section(name="Peak memory", is_open=True, panels=[
            _bars("Peak memory (MiB)", "memory.peak_mib"),
            wr.ScatterPlot(title="Peak memory vs step time", x=wr.SummaryMetric("perf.step_time_s"),
                           y=wr.SummaryMetric("memory.peak_mib")),
            _lines("Peak memory over steps (MiB)", "memory/peak_mib"),
        ]),
        ws.Section(name="Throughput", is_open=True, panels=[
            _bars("Tokens/s (after warmup)", "perf.tokens_per_s"),
            _lines("Tokens/s", "perf/tokens_per_s"),
            _lines("Step time (s)", "perf/step_time_s"),
            _lines("MFU (GPU)", "perf/mfu"),
        ]),
        ws.Section(name="Loss", is_open=True, panels=[_lines("Loss", "loss")]),
    ]


def workspace_layout(entity: str, project: str, group: str) -> ws.Workspace:
    """The workspace of one sweep: its runs only, one line/bar/point per job (named by its overrides)."""
    return ws.Workspace(
        entity=entity, project=project, name=f"fsdp_lab sweep {group}",
        sections=workspace_sections(),
        settings=ws.WorkspaceSettings(x_axis="step", max_runs=100),
        runset_settings=ws.RunsetSettings(
            filters=ws.And(ws.Metric("Group") == group),
            pinned_columns=["run:displayName", "summary:parity.ok", "summary:memory.peak_mib", "summary:perf.tokens_per_s"],
        ),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fsdp_lab.dashboard", description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", required=True, help="W&B project (logger.project of the runs)")
    parser.add_argument("--group", required=True, help="W&B group: the sweep's name, as the runs logged it")
    parser.add_argument("--entity", help="W&B entity; default: the logged-in user's default entity")
    args = parser.parse_args(argv)
    import wandb

    try:
        entity = args.entity or wandb.Api().default_entity
        saved = workspace_layout(entity, args.project, args.group).save()
    except Exception as e:  # noqa: BLE001 - network and auth errors, said in one line
        sys.exit(f"error: could not save the W&B workspace: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    print(f"workspace: {saved.url}")


if __name__ == "__main__":
    main()
