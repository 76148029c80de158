"""How the plan reads the host's figures that fsdp_lab/calibrate/host.py fits on the device.

The calibration times its runs at two widths (fsdp_lab/calibrate/host.py WIDTHS), each width's figures fitted on their own, and the plan
reads the host's figures at a block's forward kernel time (host_figures): one calibrated width's where
the block's kernels take as long, between two widths interpolated in log kernel time, beyond the
calibrated widths the nearest one's (clamped: two noisy points do not say how the host's cost
goes on). Kernel time, not width: it is what the host's time was seen to follow at one machine start
(a guess: the driver's launch path slows while long kernels run; the cost per op moved +4% from 768
to 2304 wide at one H200 calibration, +20% at the shipped one), and it carries over to a user's model of other
proportions, to TP's split kernels, to a smaller microbatch and to another device, where a width
would not."""

from __future__ import annotations

import math

from fsdp_lab.plan.device import nearest_count


def kernel_s(block_fwd) -> float:
    """What the host's figures are read at: a block's forward kernels on the GPU as the plan prices them
    (fsdp_lab.plan.cost.Parts: matmuls, attention and elementwise bytes at the bandwidth), at the
    microbatch's size and the layout's TP split; the same with AC or without, eager or compiled."""
    return block_fwd.mm + block_fwd.attn + block_fwd.mem


def host_section(host: dict, gpus: int) -> dict:
    """The table's host section for a step on `gpus` GPUs. A table calibrated on several rank counts
    ({"by_gpus": {"2": section, "4": section}}) gives the nearest count's, as its collectives do
    (plan/device.py nearest_count): 1b fsdp's host issued a step in 122 ms on 4 H100s, 104 on 2, which
    the 4-rank section prices 123 and the 2-rank one 105; a table of one count, its one section."""
    by_gpus = host.get("by_gpus")
    if not by_gpus:
        return host
    return by_gpus[str(nearest_count(map(int, by_gpus), gpus))]


def host_figures(section: dict, block_kernel_s: float) -> dict:
    """The host's figures for a block whose forward kernels take block_kernel_s: a section of one
    calibrated width (older tables: {"op_s": ...}) at any kernel time; a section of several widths
    ({"widths": [...]}, each with its block_kernel_s) interpolated in log kernel time between the two
    widths around it, each figure both have, clamped to the nearest width's beyond them. Figures beside
    the widths hold at every kernel time; a width's own figure of that name comes first."""
    points = sorted(section.get("widths", ()), key=lambda w: w["block_kernel_s"])
    if not points:
        return section
    beside = {name: v for name, v in section.items() if name != "widths"}
    if points[0]["block_kernel_s"] <= 0:  # a kernel time is read in log: a broken table, not a free block
        raise ValueError(f"host widths: block_kernel_s {points[0]['block_kernel_s']} is not a time")
    k = min(max(block_kernel_s, points[0]["block_kernel_s"]), points[-1]["block_kernel_s"])
    lo, hi = next(((a, b) for a, b in zip(points, points[1:]) if k <= b["block_kernel_s"]), (points[0], points[0]))
    span = math.log(hi["block_kernel_s"] / lo["block_kernel_s"])
    t = math.log(k / lo["block_kernel_s"]) / span if span else 0.0
    figures = {**beside, **lo, **hi}  # a figure one width lacks: the other's
    for name, v in lo.items():
        if isinstance(v, float) and isinstance(hi.get(name), float):
            figures[name] = v + (hi[name] - v) * t
    return figures
