"""python -m fsdp_lab.report PATH: report.md, report.html and plots of a run dir or a sweep dir."""

import argparse
import sys
from pathlib import Path

from fsdp_lab.report import write_report

parser = argparse.ArgumentParser(prog="python -m fsdp_lab.report", description=__doc__)
parser.add_argument("path", type=Path, help="a run dir (outputs/runs/...) or a sweep dir (outputs/sweeps/...)")
args = parser.parse_args()
if not args.path.is_dir():
    sys.exit(f"error: {args.path}: not a directory")
try:
    written = write_report(args.path)
except ValueError as e:
    sys.exit(f"error: {e}")
for path in written:
    print(f"wrote {path}")
