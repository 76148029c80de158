"""The local report of a run dir or a sweep dir: `python -m fsdp_lab.report PATH` writes
PATH/report.md and PATH/report.html with a table of every job and PNG plots under PATH/plots/."""

from __future__ import annotations

from pathlib import Path

from fsdp_lab.report.jobs import collect_jobs, common_overrides
from fsdp_lab.report.pages import html_page, markdown
from fsdp_lab.report.plots import PLOTS

PLOTS_DIR = "plots"


def write_report(path: Path) -> list[Path]:
    """Writes the report of the run or sweep at `path`; returns report.md and report.html."""
    jobs = collect_jobs(path)
    (path / PLOTS_DIR).mkdir(exist_ok=True)
    plots = {}
    for name, plot in PLOTS.items():
        written = plot(jobs, path / PLOTS_DIR / name)
        plots[name] = written.relative_to(path) if written else None
    title = f"fsdp_lab report: {path.resolve().name} ({len(jobs)} job{'s' * (len(jobs) != 1)})"
    common = common_overrides(jobs)
    md, page = path / "report.md", path / "report.html"
    md.write_text(markdown(title, common, jobs, plots))
    page.write_text(html_page(title, common, jobs, plots))
    return [md, page]
