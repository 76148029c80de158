"""What a run costs before it trains: host memory per rank during setup and wall time to the first
step, measured from outside the lab so any checkout of it can be compared:

    python benchmarks/setup_cost.py [--lab DIR] [--out FILE.json] -- LAB OVERRIDES...

Starts `python -m fsdp_lab OVERRIDES` from DIR (default: this checkout), samples every process it
starts (the launcher and its ranks) through /proc every 0.1 s: resident memory (VmRSS) and its
peak (VmHWM), and notes when the first `step 1/` line appears. Prints one JSON object."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GIB = 2**30


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of `pid` in bytes, and its parent pid; {} once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return {}
    return {
        "rss": int(fields.get("VmRSS", "0 kB").split()[0]) * 1024,
        "hwm": int(fields.get("VmHWM", "0 kB").split()[0]) * 1024,
        "ppid": int(fields["PPid"].split()[0]),
    }


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            status = _status(int(entry))
            if status:
                children.setdefault(status["ppid"], []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def measure(lab_dir: Path, overrides: list[str], timeout: float) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(lab_dir), str(lab_dir / "launchers"), env.get("PYTHONPATH", "")])
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "fsdp_lab", *overrides], cwd=lab_dir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks: dict[int, int] = {}
    total_peak = 0
    first_step: list[float] = []
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if "step 1/" in line and not first_step:
                first_step.append(time.monotonic() - start)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while proc.poll() is None and time.monotonic() - start < timeout:
        total = 0
        for pid in _descendants(proc.pid):
            status = _status(pid)
            if status:
                peaks[pid] = max(peaks.get(pid, 0), status["hwm"])
                total += status["rss"]
        total_peak = max(total_peak, total)
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    reader.join(timeout=5)
    per_process = sorted(peaks.values(), reverse=True)
    return {
        "returncode": proc.returncode, "overrides": overrides, "lab_dir": str(lab_dir),
        "time_to_first_step_s": round(first_step[0], 1) if first_step else None,
        "wall_s": round(time.monotonic() - start, 1),
        "peak_rss_gib_per_process": [round(p / GIB, 2) for p in per_process],
        "peak_total_rss_gib": round(total_peak / GIB, 2),
        "tail": "".join(lines[-8:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", type=Path, default=REPO, help="checkout of fsdp_lab to run")
    parser.add_argument("--out", type=Path, help="also write the result here")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    result = measure(args.lab.resolve(), args.overrides, args.timeout)
    text = json.dumps(result, indent=1)
    print(text, flush=True)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
