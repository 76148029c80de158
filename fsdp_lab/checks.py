"""Verdicts: named checks a run's config selects (`checks: [parity_ok, frozen_unchanged, ...]`), each
a pure function of the run's summary.json and metrics.jsonl rows, evaluated by rank 0 at the end into
summary.json's `checks{name: {ok, value, expected}}`. A check that fails leaves the run's status ok:
the run did what it was asked; the behaviour it pins down did not hold.

A check takes an argument after a colon where it needs one (`all_gather_per_step:3`). `ok` is null
when the run has nothing to judge on this device (a GPU-only figure on CPU)."""

from __future__ import annotations

import math
from collections.abc import Callable

from fsdp_lab.config import ConfigError
from fsdp_lab.memory_phases import PHASES

Verdict = dict  # {"ok": bool | None, "value": ..., "expected": ...}


def verdict(ok: bool | None, value, expected) -> Verdict:
    return {"ok": ok, "value": value, "expected": expected}


def parity_ok(summary: dict, rows: list[dict]) -> Verdict:
    """The parity probe's verdict: the worst loss and parameter drift from the DDP reference within tolerance."""
    p = summary.get("parity") or {}
    if not p.get("enabled"):
        return verdict(False, "parity probe off", "probes.parity.enabled=true")
    return verdict(
        bool(p["ok"]), {"max_loss_abs_diff": p["max_loss_abs_diff"], "max_param_abs_diff": p["max_param_abs_diff"]},
        {"max_loss_abs_diff": f"<= {p['tolerance']:g}", "max_param_abs_diff": f"<= {p['param_tolerance']:g}"},
    )


def frozen_unchanged(summary: dict, rows: list[dict]) -> Verdict:
    """Every parameter model.freeze matched holds its initial value after training (bitwise)."""
    f = summary.get("frozen")
    if not f or not f["compared_numel"]:
        return verdict(False, "no frozen parameter compared", "model.freeze matching parameters")
    return verdict(f["max_abs_change"] == 0.0, f["max_abs_change"], 0.0)


PHASE_KEYS = {f"memory/{phase}{kind}_mib": f"{phase}{kind}" for phase in PHASES for kind in ("", "_reserved")}


def _phase_rows(rows: list[dict]) -> list[dict[str, float]]:
    """Each row's memory at the phases of its step (allocated, and on GPU reserved), not its peaks."""
    return [{name: r[key] for key, name in PHASE_KEYS.items() if key in r} for r in rows]


def phases_stable(summary: dict, rows: list[dict]) -> Verdict:
    """After the first iteration (which creates the optimizer state) every phase's memory repeats:
    the largest |phase(step k) - phase(step 2)| over k >= 2 and every phase is 0. As PyTorch's
    test_fsdp_memory, the phases only: a step's peak is no phase, and on CPU it may count for a moment
    the buffer of a collective that gloo's worker thread is about to let go (128 B, now and then)."""
    phases = [p for p in _phase_rows(rows) if p]
    if len(phases) < 3:
        return verdict(False, f"{len(phases)} steps with memory", ">= 3 steps with probes.memory.enabled=true")
    second = phases[1]
    drift = max(abs(p.get(k, math.inf) - v) for p in phases[2:] for k, v in second.items())
    return verdict(drift <= 1e-9, drift, 0.0)


def optimizer_state_in_first_step(summary: dict, rows: list[dict]) -> Verdict:
    """Iteration 1's optimizer step creates the optimizer state, and that is what stays: the growth
    from after_bwd to after_step of step 1 (value) is > 0 and within 1% or 8 KiB of the growth of the
    start of the step from step 1 to step 2 (expected). FSDP's lazy initialisation in step 1 keeps a
    few small tensors too, which the CUDA allocator rounds up to 512-byte blocks."""
    phases = _phase_rows(rows)
    if len(phases) < 2 or not all(k in phases[0] for k in ("after_bwd", "after_step")) or "start" not in phases[1]:
        return verdict(False, "missing per-phase memory", ">= 2 steps with probes.memory.enabled=true")
    created = phases[0]["after_step"] - phases[0]["after_bwd"]
    kept = phases[1]["start"] - phases[0]["start"]
    return verdict(created > 0 and math.isclose(created, kept, rel_tol=0.01, abs_tol=8 / 1024), created, kept)


def _per_step_count(kind: str) -> Callable[[dict, list[dict], str], Verdict]:
    def check(summary: dict, rows: list[dict], arg: str) -> Verdict:
        key = f"comm/{kind}_count"
        counts = sorted({r.get(key) for r in rows}, key=str)
        if counts == [None]:
            return verdict(False, "no collective counts", "probes.comm.enabled=true")
        return verdict(counts == [int(arg)], counts[0] if len(counts) == 1 else counts, int(arg))

    check.__doc__ = f"Every step issues exactly ARG {kind} collectives (comm/{kind}_count, probes.comm.enabled=true)."
    return check


def tracker_categories_sum_to_peak(summary: dict, rows: list[dict]) -> Verdict:
    """The module tracker's peak is accounted for: its categories (params, grads, activations,
    optimizer state, buffers, ...) sum to it."""
    m = summary.get("memory") or {}
    if m.get("tracker_peak_categories_mib") is None:
        return verdict(False, "no module tracker", "probes.memory.tracker=module")
    total = sum(m["tracker_peak_categories_mib"].values())
    return verdict(m["tracker_peak_mib"] > 0 and math.isclose(total, m["tracker_peak_mib"], rel_tol=1e-9), total, m["tracker_peak_mib"])


def tracker_accuracy(summary: dict, rows: list[dict]) -> Verdict:
    """GPU: the module tracker's peak within 10% of the CUDA allocator's (memory/tracker_accuracy in
    0.9..1.1); null on CPU, where there is no allocator to compare with."""
    accuracy = (summary.get("memory") or {}).get("tracker_accuracy")
    if accuracy is None:
        return verdict(None, None, "0.9..1.1 (GPU only)")
    return verdict(0.9 <= accuracy <= 1.1, accuracy, "0.9..1.1")


def resumed(summary: dict, rows: list[dict]) -> Verdict:
    """The run continued from a checkpoint (checkpoint.resume, or a restart with checkpoint.resume=auto)
    and reports every step from 1 on, each once."""
    origin = (summary.get("checkpoint") or {}).get("resumed_from")
    steps = [r["step"] for r in rows]
    return verdict(origin is not None and steps == list(range(1, summary["steps"] + 1)), origin, "a checkpoint, steps 1..N once each")


CHECKS: dict[str, Callable[[dict, list[dict]], Verdict]] = {
    f.__name__: f
    for f in (parity_ok, frozen_unchanged, phases_stable, optimizer_state_in_first_step, tracker_categories_sum_to_peak, tracker_accuracy, resumed)
}
COUNT_CHECKS = {f"{kind}_per_step": _per_step_count(kind) for kind in ("all_gather", "reduce_scatter", "all_reduce")}


def parse(spec: str) -> tuple[str, str | None]:
    """`name` or `name:ARG`, checked: the check exists and takes an argument iff it needs one."""
    name, _, arg = spec.partition(":")
    if name in CHECKS and not arg:
        return name, None
    if name in COUNT_CHECKS and arg.isdigit():
        return name, arg
    allowed = ", ".join([*CHECKS, *(f"{n}:N" for n in COUNT_CHECKS)])
    raise ConfigError(f"checks={spec}: allowed are {allowed}")


def evaluate(specs: list[str], summary: dict, rows: list[dict]) -> dict[str, Verdict]:
    """Every selected check's verdict, keyed by its spec."""
    out = {}
    for spec in specs:
        name, arg = parse(spec)
        out[spec] = CHECKS[name](summary, rows) if arg is None else COUNT_CHECKS[name](summary, rows, arg)
    return out


def describe(spec: str, v: Verdict) -> str:
    """One line: `check NAME: ok|FAILED|n/a (value V, expected E)`."""
    state = {True: "ok", False: "FAILED", None: "n/a"}[v["ok"]]
    return f"check {spec}: {state} (value {v['value']}, expected {v['expected']})"
