"""report.md and report.html from the same table, picks and plots (paths relative to the report)."""

from __future__ import annotations

import html
from pathlib import Path

from fsdp_lab.report.jobs import Job

COLUMNS = ["job", "overrides", "status", "parity", "final loss", "peak MiB", "step ms", "tokens/s"]


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def parity_cell(job: Job) -> str:
    if job.parity_ok is None:
        steps, diffs = job.series("parity/loss_abs_diff")
        # A run that stopped early has no verdict, but the steps it finished were compared.
        return f"no verdict (Δloss {max(diffs):.1e} in {len(steps)} steps)" if diffs else "not checked"
    p = job.parity
    verdict = "ok" if job.parity_ok else "DRIFT"
    return f"{verdict} (Δloss {p['max_loss_abs_diff']:.1e}, Δparam {p['max_param_abs_diff']:.1e})"


def table_rows(jobs: list[Job]) -> list[list[str]]:
    return [
        [
            job.num, job.label or "(defaults)", job.status, parity_cell(job), _num(job.final_loss, ".5f"),
            _num(job.peak_mib, ".2f"), _num(job.step_time_s and job.step_time_s * 1e3, ".1f"),
            _num(job.tokens_per_s, ",.0f"),
        ]
        for job in jobs
    ]


def picks(jobs: list[Job]) -> list[str]:
    """The layouts a user most often wants, among finished jobs whose parity is not in doubt."""
    trusted = [j for j in jobs if j.status == "ok" and j.parity_ok is not False]
    lines = []
    for what, key, best in (
        ("Lowest peak memory", lambda j: j.peak_mib, min),
        ("Highest throughput", lambda j: j.tokens_per_s, max),
    ):
        candidates = [j for j in trusted if key(j) is not None]
        if candidates:
            job = best(candidates, key=key)
            lines.append(f"{what}: #{job.num} {job.label or '(defaults)'}")
    return lines


def failures(jobs: list[Job]) -> list[str]:
    return [f"#{j.num}: {j.status}: {(j.summary or {}).get('error') or 'no summary.json'}" for j in jobs if j.status != "ok"]


def markdown(title: str, common: list[str], jobs: list[Job], plots: dict[str, Path | None]) -> str:
    out = [f"# {title}", ""]
    if common:
        out += [f"Common overrides: `{' '.join(common)}`", ""]
    out += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table_rows(jobs)]
    out.append("")
    out += [f"- {line}" for line in picks(jobs) + failures(jobs)]
    for name, path in plots.items():
        out += ["", f"![{name}]({path.as_posix()})" if path else f"_{name}: no job recorded this data._"]
    return "\n".join(out) + "\n"


def html_page(title: str, common: list[str], jobs: list[Job], plots: dict[str, Path | None]) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in table_rows(jobs))
    notes = "".join(f"<li>{esc(line)}</li>" for line in picks(jobs) + failures(jobs))
    images = "".join(
        f'<p><img src="{esc(path.as_posix())}" alt="{esc(name)}"></p>' if path else f"<p><em>{esc(name)}: no job recorded this data.</em></p>"
        for name, path in plots.items()
    )
    common_line = f"<p>Common overrides: <code>{esc(' '.join(common))}</code></p>" if common else ""
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}img{max-width:100%}</style></head>"
        f"<body><h1>{esc(title)}</h1>{common_line}<table><tr>{head}</tr>{body}</table><ul>{notes}</ul>{images}</body></html>\n"
    )
