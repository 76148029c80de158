"""mode=estimate: predict a configuration's memory per rank without its hardware, in one process
(trace.py traces one step of one rank on a fake world; report.py makes the answer of it)."""

from fsdp_lab.estimate.report import ESTIMATE_FILE, estimate, run_estimate
from fsdp_lab.estimate.trace import StepTrace, trace_step

__all__ = ["ESTIMATE_FILE", "StepTrace", "estimate", "run_estimate", "trace_step"]
