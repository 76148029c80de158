"""The GPUs' SM clock, power draw and clock-event reasons during each run of a speed.py invocation:
whether a run was slow because its GPUs were held down (the power cap, heat) rather than by the lab.

    python benchmarks/speed.py ... --json runs.json --gpu-clocks smi.csv   # samples nvidia-smi every second
    python benchmarks/gpu_clocks.py smi.csv runs.json                      # the table again, from the files

For each run (its `started` and `ended` in the --json file) and each GPU: the mean SM clock and power
and the highest temperature over the 1-second samples that draw more than MIN_WATTS (the steps; a
run's start-up and compiling draw less), and the clock-event reasons seen (0x4: the software power
cap; 0x0: none)."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

MIN_WATTS = 300.0
FIELDS = "timestamp,index,clocks.sm,power.draw,temperature.gpu,{reasons}"


class Sample(NamedTuple):
    at: float  # seconds since the epoch, as time.time()
    gpu: int
    sm_mhz: float
    watts: float
    temp_c: float
    reasons: str


def reasons_field() -> str:
    """The clock-event reasons' field name this driver knows (older drivers call them throttle reasons)."""
    probe = subprocess.run(["nvidia-smi", "--query-gpu=clocks_event_reasons.active", "--format=csv"], capture_output=True)
    return "clocks_event_reasons.active" if probe.returncode == 0 else "clocks_throttle_reasons.active"


@contextlib.contextmanager
def sampling(path: Path, every_ms: int = 1000):
    """nvidia-smi writing a sample of every GPU to `path` every `every_ms` until the block ends."""
    with path.open("w") as out:
        line_buffered = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []  # each sample in the file as it comes
        proc = subprocess.Popen([*line_buffered, "nvidia-smi", f"--query-gpu={FIELDS.format(reasons=reasons_field())}",
                                 "--format=csv,noheader,nounits", "-lms", str(every_ms)], stdout=out, stderr=subprocess.DEVNULL)
        try:
            yield
        finally:
            proc.terminate()
            proc.wait()


def read(path: Path) -> list[Sample]:
    """The samples of a `sampling` file; lines that are not samples (a header, a field not supported) are skipped."""
    samples = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            at = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append(Sample(at, int(parts[1]), float(parts[2]), float(parts[3]), float(parts[4]), parts[5]))
        except (ValueError, IndexError):
            continue
    return samples


def during(samples: list[Sample], start: float, end: float, min_watts: float = MIN_WATTS) -> dict:
    """Per GPU, over the samples in [start, end) drawing more than min_watts: mean SM MHz and watts, the
    highest temperature; the reasons seen; how many samples a GPU had at most."""
    busy = [s for s in samples if start <= s.at < end and s.watts > min_watts]
    by_gpu: dict[int, list[Sample]] = {}
    for s in busy:
        by_gpu.setdefault(s.gpu, []).append(s)
    return {"gpus": {g: {"sm_mhz": round(statistics.mean(s.sm_mhz for s in xs)), "watts": round(statistics.mean(s.watts for s in xs)),
                         "max_temp_c": max(s.temp_c for s in xs)} for g, xs in sorted(by_gpu.items())},
            "reasons": sorted({s.reasons for s in busy}), "samples": max((len(xs) for xs in by_gpu.values()), default=0)}


def line(name: str, tokens_per_s: float, clocks: dict) -> str:
    gpus = "  ".join(f"GPU {g}: {c['sm_mhz']} MHz/{c['watts']} W/{c['max_temp_c']:g} C" for g, c in clocks["gpus"].items())
    return f"{name:13} {tokens_per_s:10.0f} tokens/s  {gpus or 'no sample over the power threshold'}  reasons {', '.join(clocks['reasons']) or '-'}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("smi", type=Path, help="the file speed.py --gpu-clocks wrote")
    p.add_argument("runs", type=Path, help="the invocation's --json file")
    a = p.parse_args()
    samples = read(a.smi)
    runs = json.loads(a.runs.read_text())["runs"]
    if any("started" not in r for rs in runs.values() for r in rs):
        p.error(f"{a.runs}: its runs lack `started` and `ended` (speed.py records them since 2026-11-28)")
    for name, run in sorted(((n, r) for n, rs in runs.items() for r in rs), key=lambda nr: nr[1]["at"]):
        print(line(name, run["tokens_per_s"], during(samples, run["started"], run["ended"])))


if __name__ == "__main__":
    main()
