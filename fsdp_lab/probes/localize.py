"""Where did a sharded run first diverge from its reference? One step's forward and backward is
replayed on both with hooks on every module; each module's outputs (per call) and its own
parameters' gradients (the local shard against the matching slice of the reference's) are compared.
The report names the first module, in forward execution order (the order modules finish their
forward, so an inner module comes before the block holding it), whose output differs beyond the
tolerance, then the first whose parameter gradient does, each with the difference and the
magnitude it is measured against. Every rank compares its own part; the report merges them (the
largest difference of any rank) in the order the reference, which holds the whole model on every
rank, runs its modules."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp._common_utils import clean_tensor_name
from torch.distributed.tensor import DTensor, distribute_tensor

from fsdp_lab.modules import unwrap
from fsdp_lab.sinks.files import write_json_atomic

REPORT_JSON = "parity_report.json"
REPORT_MD = "parity_report.md"


def _first_tensor(output):
    if isinstance(output, (tuple, list)):
        output = next((o for o in output if isinstance(o, torch.Tensor)), None)
    return output if isinstance(output, torch.Tensor) else None


@contextlib.contextmanager
def recorded_outputs(model: nn.Module):
    """Yields {module name: [output of each call]} (float64, on the CPU, whole for DTensor outputs)
    and the names in the order their first call finished."""
    outputs: dict[str, list[torch.Tensor]] = {}
    order: list[str] = []

    def hook(name, module, args, output):
        t = _first_tensor(output)
        if t is None:
            return
        if isinstance(t, DTensor):
            t = t.full_tensor()
        if name not in outputs:
            outputs[name] = []
            order.append(name)
        outputs[name].append(t.detach().double().cpu())

    handles = [
        m.register_forward_hook(lambda mod, args, out, name=clean_tensor_name(name): hook(name, mod, args, out))
        for name, m in unwrap(model).named_modules() if name
    ]
    try:
        yield outputs, order
    finally:
        for h in handles:
            h.remove()


def _grad_pairs(model: nn.Module, reference: nn.Module) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    """{module name: [(local gradient, the matching part of the reference's)]} for the module's own
    parameters (FSDP1's flat parameters have no per-module gradients and are left out)."""
    ref_params = dict(unwrap(reference).named_parameters())
    out: dict[str, list] = {}
    for name, module in unwrap(model).named_modules():
        for pname, p in module.named_parameters(recurse=False):
            full = clean_tensor_name(f"{name}.{pname}" if name else pname)
            ref = ref_params.get(full)
            if p.grad is None or ref is None or ref.grad is None:
                continue
            expected = ref.grad
            grad = p.grad
            if isinstance(grad, DTensor):
                expected = distribute_tensor(expected, grad.device_mesh, grad.placements, src_data_rank=None).to_local()
                grad = grad.to_local()
            out.setdefault(clean_tensor_name(name), []).append((grad, expected))
    return out


def _worst(pairs) -> tuple[float, float] | None:
    """(largest |a - b|, largest |b|) over the pairs of equal shape; None if there are none (a
    tensor-parallel output that stays a local slice)."""
    found = None
    for a, b in pairs:
        if a.shape != b.shape or not a.numel():
            continue
        a, b = a.detach().double().cpu(), b.detach().double().cpu()
        diff, mag = float((a - b).abs().max()), float(b.abs().max())
        found = (diff, mag) if found is None else (max(found[0], diff), max(found[1], mag))
    return found


def compare(
    model: nn.Module, reference: nn.Module, replay: Callable[[], None], replay_reference: Callable[[], None],
) -> tuple[list[str], dict[str, dict]]:
    """Replay on both models; returns the reference's module order and, per module, this rank's
    {forward_max_abs_diff, forward_max_abs, grad_max_abs_diff, grad_max_abs} (where measured)."""
    with recorded_outputs(model) as (outputs, _):
        replay()
    with recorded_outputs(reference) as (ref_outputs, order):
        replay_reference()
    found: dict[str, dict] = {}
    for name, calls in outputs.items():
        worst = _worst(zip(calls, ref_outputs.get(name, ())))
        if worst is not None:
            found[name] = dict(zip(("forward_max_abs_diff", "forward_max_abs"), worst))
    for name, pairs in _grad_pairs(model, reference).items():
        worst = _worst(pairs)
        if worst is not None:
            found.setdefault(name, {}).update(zip(("grad_max_abs_diff", "grad_max_abs"), worst))
    return order, found


def merged_over_ranks(found: dict[str, dict]) -> dict[str, dict]:
    """Every rank's findings, the largest of each figure per module."""
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, found)
    merged: dict[str, dict] = {}
    for rank_found in ranks:
        for name, figures in rank_found.items():
            entry = merged.setdefault(name, {})
            for key, value in figures.items():
                entry[key] = max(entry.get(key, value), value)
    return merged


def build_report(step: int, replayed_on: str, tolerance: float, order: list[str], merged: dict[str, dict]) -> dict:
    modules = [{"module": name, **merged[name]} for name in order if name in merged]

    def first(kind: str) -> dict | None:
        hit = next((m for m in modules if m.get(f"{kind}_max_abs_diff", 0.0) > tolerance), None)
        if hit is None:
            return None
        return {"module": hit["module"], "max_abs_diff": hit[f"{kind}_max_abs_diff"], "max_abs": hit[f"{kind}_max_abs"]}

    return {
        "step": step, "replayed_on": replayed_on, "tolerance": tolerance,
        "forward": first("forward"), "grad": first("grad"), "modules": modules,
    }


def headline(report: dict) -> str:
    """One line for the console and the summary."""
    parts = []
    for kind, what in (("forward", "output"), ("grad", "parameter gradient")):
        hit = report[kind]
        if hit is not None:
            parts.append(f"{what} of {hit['module']} (|diff| {hit['max_abs_diff']:.3g} at magnitude {hit['max_abs']:.3g})")
    if not parts:
        return f"parity: step {report['step']} replayed: no module differs beyond {report['tolerance']:g}"
    return f"parity: step {report['step']} replayed: first divergence in " + ", then in ".join(parts)


def render(report: dict) -> str:
    lines = [
        f"# Parity localisation, step {report['step']}", "",
        f"{headline(report)}.", "", f"Replayed on {report['replayed_on']}; tolerance {report['tolerance']:g}.", "",
        "Modules in forward execution order (differences: largest over ranks and calls).", "",
        "| module | output max abs diff | output max abs | grad max abs diff | grad max abs |",
        "|---|---|---|---|---|",
    ]

    def cell(m: dict, key: str) -> str:
        return f"{m[key]:.3g}" if key in m else ""

    for m in report["modules"]:
        keys = ("forward_max_abs_diff", "forward_max_abs", "grad_max_abs_diff", "grad_max_abs")
        lines.append(f"| {m['module']} | " + " | ".join(cell(m, k) for k in keys) + " |")
    return "\n".join(lines) + "\n"


def write_report(run_dir: Path, report: dict) -> None:
    write_json_atomic(run_dir / REPORT_JSON, report)
    (run_dir / REPORT_MD).write_text(render(report))
