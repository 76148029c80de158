"""The report's PNG plots (matplotlib, Agg: no display needed). Each returns the file it wrote, or
None when no job has the data it shows."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fsdp_lab.memory_phases import PHASES  # noqa: E402
from fsdp_lab.report.jobs import Job  # noqa: E402

VERDICT_MARKERS = {True: ("o", "parity ok"), False: ("X", "parity DRIFT"), None: ("s", "no parity verdict")}
# Parity drift is often exactly 0; a linear band around 0 keeps it on a log-like axis.
DRIFT_LINTHRESH = 1e-12


def legend_name(job: Job) -> str:
    return f"#{job.num} {job.label}".strip()


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def memory_per_phase(jobs: list[Job], path: Path) -> Path | None:
    """Grouped bars: memory at each phase of the last step, and the peak, one bar per job."""
    measured = [j for j in jobs if j.phases_mib]
    if not measured:
        return None
    columns = [*PHASES, "peak"]
    width = 0.8 / len(measured)
    fig, ax = plt.subplots(figsize=(max(7, 1.2 * len(columns) + 0.3 * len(measured)), 4.5))
    for i, job in enumerate(measured):
        values = [job.phases_mib.get(p, 0.0) for p in PHASES] + [job.peak_mib or 0.0]
        ax.bar([c + (i - (len(measured) - 1) / 2) * width for c in range(len(columns))], values, width, label=legend_name(job))
    ax.set_xticks(range(len(columns)), columns)
    ax.set_ylabel("MiB")
    ax.set_title("Memory per phase of a step (last step), and the peak")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1, 1))
    return _save(fig, path)


def loss_and_parity(jobs: list[Job], path: Path) -> Path | None:
    """Loss over steps, and the parity drift against the reference over steps."""
    with_loss = [j for j in jobs if j.rows]
    if not with_loss:
        return None
    fig, (loss_ax, drift_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    tolerances = set()
    for job in with_loss:
        line, = loss_ax.plot(*job.series("loss"), marker=".", label=legend_name(job))
        steps, diffs = job.series("parity/loss_abs_diff")
        if steps:
            drift_ax.plot(steps, diffs, marker=".", color=line.get_color(), label=f"#{job.num} loss")
            drift_ax.plot(*job.series("parity/param_max_abs_diff"), "x--", color=line.get_color(), label=f"#{job.num} params")
        if job.parity.get("tolerance") is not None:
            tolerances.add(job.parity["tolerance"])
    for tol in sorted(tolerances):
        drift_ax.axhline(tol, color="black", linestyle=":", linewidth=1, label=f"tolerance {tol:g}")
    for ax in (loss_ax, drift_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    loss_ax.set(title="Loss", xlabel="step", ylabel="loss")
    loss_ax.legend(fontsize="small")
    drift_ax.set(title="Parity drift vs the reference (|Δ|)", xlabel="step", ylabel="max abs diff")
    drift_ax.set_yscale("symlog", linthresh=DRIFT_LINTHRESH)
    drift_ax.set_ylim(bottom=0)
    if drift_ax.has_data():
        drift_ax.legend(fontsize="x-small", ncol=2)
    else:
        drift_ax.text(0.5, 0.5, "parity not checked", ha="center", va="center", transform=drift_ax.transAxes)
    return _save(fig, path)


def memory_vs_step_time(jobs: list[Job], path: Path) -> Path | None:
    """Each job as a point: step time against peak memory; the marker tells its parity verdict."""
    placed = [j for j in jobs if j.peak_mib is not None and j.step_time_s is not None]
    if not placed:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for job in placed:
        x, y = job.step_time_s * 1e3, job.peak_mib
        marker, verdict = VERDICT_MARKERS[job.parity_ok]
        ax.scatter(x, y, s=70, marker=marker, label=f"{legend_name(job)} ({verdict})")
        ax.annotate(f"#{job.num}", (x, y), textcoords="offset points", xytext=(6, 4), fontsize="small")
    ax.set(title="Peak memory vs step time (lower left is better)", xlabel="step time (ms)", ylabel="peak memory (MiB)")
    ax.legend(fontsize="small")
    ax.margins(0.2)
    return _save(fig, path)


PLOTS = {
    "memory_per_phase.png": memory_per_phase,
    "loss_and_parity.png": loss_and_parity,
    "memory_vs_step_time.png": memory_vs_step_time,
}
