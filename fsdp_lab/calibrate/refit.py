"""A device table's fitted figures again from its own stored measurements, by the plan's current trace
and pricing: a CPU step, no GPU, for when what the trace records changes (ops added or priced
otherwise) after the table was measured.

What calibrate_device.py fits divides a measured time by what the plan's trace counts or prices:
the host's seconds per op (each width's run times over the ops its model traces) and a block's
`eager_factor` (its measured elementwise time over the pricing of its traced ops). Both halves must
come from one version of the trace, or a prediction carries the difference; the measurements (the
runs' host and step times, the blocks' device times, the kernel sections) stay as measured."""

from __future__ import annotations

from fsdp_lab.plan.device import Device
from fsdp_lab.calibrate.elementwise import fit_elementwise
from fsdp_lab.calibrate.host import at_width, fit_section, widths


def refit(table: dict) -> dict:
    """`table` (a device table's JSON) with its host and elementwise figures fitted again; its kernel
    sections, measurements and provenance kept, each fitted section naming the torch that traced it
    (`traced_on`). Refuses a table whose host widths are not the calibration's, and an older host
    section of one width (h100-80gb: its runs' depths and shapes are not the calibration's, nor
    stored): their runs cannot be traced as they ran, and left as they are they would pass for refitted."""
    out = dict(table)
    device = Device(table.get("name", "table"), table)
    host = table.get("host", {})
    if "by_gpus" in host:  # a section per rank count it was timed on
        out["host"] = {"by_gpus": {n: _refit_host(section, device) for n, section in host["by_gpus"].items()}}
    elif host:
        out["host"] = _refit_host(host, device)
    if "blocks" in table.get("elementwise", {}):
        measured = [{k: v for k, v in b.items() if k not in ("priced_elementwise_s", "eager_factor", "compiled_share")}
                    for b in table["elementwise"]["blocks"]]
        out["elementwise"] = fit_elementwise(measured, device)
    return out


def _refit_host(section: dict, device: Device) -> dict:
    """One host section's widths fitted again from their stored run times."""
    if "widths" not in section:
        raise ValueError("the host section is an older one of one width, whose runs cannot be traced again: measure it again (--host-only)")
    stored = sorted(w["dim"] for w in section["widths"])
    if stored != sorted(w["dim"] for w in widths()):
        raise ValueError(f"host widths {stored} are not the calibration's {[w['dim'] for w in widths()]}: measure them again")

    def by_run(measured):  # a width's stored times by run name, as the calibration timed them
        return {run + at_width(w): s for w in section["widths"] for run, s in w.get(measured, {}).items()}
    return {**section, **fit_section(by_run("measured_host_step_s"), device, step_s=by_run("measured_step_s"))}
