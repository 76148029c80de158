"""Throughput: step time, tokens/s per device and, on GPUs with a known peak, MFU; the iteration
time, which adds what the loop does around the step (other probes, sinks, checkpoints); and the
host's time to issue the step (to its last phase mark, before the loss's sync waits for the GPU)."""

from __future__ import annotations

import statistics
import time

import torch

# Dense bf16 tensor-core peak in FLOP/s, by a substring of the device name.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12}


def device_peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_FLOPS.items() if key in name), None)


class Throughput:
    def __init__(self, *, tokens_per_step: int, world_size: int, flops_per_token: float, device: torch.device, warmup_steps: int):
        self.tokens_per_device = tokens_per_step / world_size
        self.flops_per_token = flops_per_token
        self.peak = device_peak_flops(device)
        self.warmup_steps = warmup_steps
        self.step_times: list[float] = []
        self.iteration_times: list[float] = []
        self.host_times: list[float] = []
        """Per step: seconds from its start until the host has issued its last op (zero_grad done).
        Where nothing in the step waits for the GPU before then (FSDP2 waits through streams, not
        the host), it is the host's own time whether the GPU keeps up or not: the plan's host
        calibration reads it (fsdp_lab/calibrate/host.py)."""
        self._last_metrics_at: float | None = None

    def metrics(self, step_time_s: float) -> dict[str, float | None]:
        """The step's figures; from the second step on also `perf/iteration_time_s`, the wall time
        since the previous step's figures: one whole turn of the loop, probes and sinks included."""
        self.step_times.append(step_time_s)
        out = self._figures(step_time_s)
        now = time.perf_counter()
        if self._last_metrics_at is not None:
            self.iteration_times.append(now - self._last_metrics_at)
            out["perf/iteration_time_s"] = self.iteration_times[-1]
        self._last_metrics_at = now
        return out

    def _figures(self, step_time_s: float) -> dict[str, float | None]:
        tokens_per_s = self.tokens_per_device / step_time_s
        mfu = tokens_per_s * self.flops_per_token / self.peak if self.peak else None
        return {"perf/step_time_s": step_time_s, "perf/tokens_per_s": tokens_per_s, "perf/mfu": mfu}

    def summary(self) -> dict[str, float | None]:
        """Median over the steps after warm-up (all steps if the run is shorter than the warm-up)."""
        timed = self.step_times[self.warmup_steps :] or self.step_times
        if not timed:
            return {"step_time_s": None, "tokens_per_s": None, "mfu": None, "iteration_time_s": None, "host_step_s": None}
        # iteration_times[i] ends at step i + 2: the same warm-up is left out.
        iterations = self.iteration_times[max(self.warmup_steps - 1, 0) :] or self.iteration_times
        host = self.host_times[self.warmup_steps :] or self.host_times
        return {
            **{k.split("/")[1]: v for k, v in self._figures(statistics.median(timed)).items()},
            "iteration_time_s": statistics.median(iterations) if iterations else None,
            "host_step_s": statistics.median(host) if host else None,
        }
