"""summary.json, built in one place: the run's facts, then each probe's section (fsdp_lab/probes/),
the checkpoint's, and the checks' verdicts. SCHEMA writes its keys down once; the tests and the
report read them from here. sinks.files.write_summary is the one function that writes the file."""

from __future__ import annotations

from fsdp_lab.config import RunConfig
from fsdp_lab.mesh import ParallelDims

# Every key summary.json may hold: "section.key" for a section's keys; a section whose keys are open
# (per phase, per category, per check) lists none below it.
SCHEMA: dict[str, str] = {
    "status": "running | ok | failed | interrupted",
    "error": "rank N: ExceptionType: message, or null",
    "steps": "optimizer steps finished",
    "world_size": "ranks",
    "device": "cpu | cuda",
    "mesh": "{pp, dp_replicate, dp_shard, tp, engine}",
    "final_loss": "the last step's loss (mean over data-parallel ranks)",
    "layout": "layout=auto: what it chose before the ranks started (absent with layout=config)",
    "layout.mode": "auto",
    "layout.device": "the plan's device table, or null where none describes the GPUs (CPU)",
    "layout.gpus": "the GPUs planned for",
    "layout.chosen": "{overrides: the candidate's keys applied, kept: the command line's keys it agreed with}, or null (the config's layout kept)",
    "layout.reason": "why the config's layout was kept",
    "layout.plan_s": "seconds the plan took to choose: what layout=auto added to the run's start",
    "layout.from_cache": "the choice an earlier run with the same inputs made, taken without planning (fsdp_lab/layout_cache.py)",
    "layout.predicted": "the plan's step_time_s, peak_mib and tokens_per_s_per_gpu for the chosen layout",
    "parity": "the parity probe's verdict; {enabled: false} when it is off",
    "parity.enabled": "whether the probe ran",
    "parity.ok": "every figure within its tolerance",
    "parity.reference": "ddp-<dtype>",
    "parity.tolerance": "loss tolerance (by compute dtype; with float8 linears float8.parity_tolerance, a drift from the high-precision reference)",
    "parity.param_tolerance": "parameter and gradient-norm tolerance",
    "parity.max_loss_abs_diff": "largest |loss - reference loss| over steps",
    "parity.max_param_abs_diff": "largest |parameter shard - reference slice|",
    "parity.max_grad_norm_abs_diff": "largest |grad/norm - reference's| over steps",
    "parity.localized": "where the replayed step first diverged (parity_report.json), when it was localised",
    "parity.localized.step": "the replayed step (1-based)",
    "parity.localized.forward_module": "first module whose output differs beyond tolerance, or null",
    "parity.localized.grad_module": "first module whose parameter gradient differs beyond tolerance, or null",
    "parity.localized.param": "not replayed (the parameters the step left already differ): the first differing parameter, else null",
    "parity.localized.report": "the report's file name in the run dir",
    "parity.first_divergence": "when parity failed: the localiser's one line (where the run first diverged)",
    "memory": "the per-phase probe's and the module tracker's figures; null when both are off",
    "memory.peak_mib": "the run's peak",
    "memory.reserved_peak_mib": "GPU: the caching allocator's reserved peak",
    "memory.ranks_peak_mib": "GPU: every rank's peak, in rank order",
    "memory.phases_mib": "the last step's phases",
    "memory.phases_max_mib": "each phase's maximum over the steps",
    "memory.tracker_peak_mib": "probes.memory.tracker=module: the tracked step's peak",
    "memory.tracker_peak_categories_mib": "its categories at the peak",
    "memory.tracker_accuracy": "GPU: tracker peak / allocator peak",
    "perf": "the throughput probe's medians after warm-up; null when it is off",
    "perf.step_time_s": "",
    "perf.tokens_per_s": "per device",
    "perf.mfu": "GPU with a known peak, else null",
    "perf.iteration_time_s": "the whole loop's turn",
    "perf.host_step_s": "the host's time to issue the step (to zero_grad; before the loss's sync)",
    "frozen": "model.freeze: the frozen parameters' change (absent without model.freeze)",
    "frozen.params": "parameters frozen",
    "frozen.compared_numel": "elements compared over ranks",
    "frozen.max_abs_change": "largest change (0.0 when they held)",
    "profile": "probes.profile.enabled: rank 0's profiled window (absent when it is off)",
    "profile.first_step": "the window's first step (1-based; a run resumed inside it: the first it trained)",
    "profile.steps": "steps profiled (0: the run was resumed past the window)",
    "profile.device": "cuda: self times are the kernels' on the GPU; cpu: the host's",
    "profile.self_ms_per_step": "every op's self time per step, summed",
    "profile.top_ops": "[{name, self_ms_per_step, total_ms_per_step, calls_per_step}], largest self time first",
    "checkpoint": "{resumed_from, last_saved}, or null without checkpoints",
    "checkpoint.resumed_from": "",
    "checkpoint.last_saved": "",
    "checks": "{name: {ok, value, expected}} for the checks the run selected",
}

# What a section holds when its probe is off.
ABSENT_SECTIONS = {"parity": {"enabled": False}, "memory": None, "perf": None}


def base_summary(run: RunConfig, dims: ParallelDims, device: str) -> dict:
    """The summary of a run that has not finished (or never started its ranks)."""
    return {
        "status": "running", "error": None, "steps": 0, "world_size": dims.world_size, "device": device,
        "mesh": {**dims.as_dict(), "engine": run.mesh.engine},
        **({"layout": run.layout_auto} if run.layout_auto is not None else {}),
    }


def probe_sections(probes: list) -> dict:
    """The probes' sections (every rank computes them: some compare over ranks), in probe order;
    two probes filling one section (memory) merge."""
    out: dict = dict(ABSENT_SECTIONS)
    for probe in probes:
        for key, value in probe.summary().items():
            out[key] = {**(out.get(key) or {}), **value} if isinstance(value, dict) else value
    return out


def finished(summary: dict, *, steps: int, final_loss: float | None, probes: list, checkpoint: dict | None) -> dict:
    """`summary` completed for a run that trained to the end."""
    return {**summary, "status": "ok", "steps": steps, "final_loss": final_loss, **probe_sections(probes), "checkpoint": checkpoint}


def keys_of(summary: dict, prefix: str = "") -> set[str]:
    """The schema's names of the keys `summary` holds (open sections are not descended into)."""
    out = set()
    for key, value in summary.items():
        name = f"{prefix}{key}"
        out.add(name)
        if isinstance(value, dict) and any(k.startswith(name + ".") for k in SCHEMA):
            out |= keys_of(value, name + ".")
    return out
