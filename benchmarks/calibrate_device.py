"""The command line of fsdp_lab/calibrate/: measure the device table `mode=plan` costs a step with.
The kernels (matmul, attention, bandwidth, the optimizer's step, NCCL collectives, a block's
elementwise time eager and compiled: fsdp_lab/calibrate/kernels.py) and the host's time to issue a
step (fsdp_lab/calibrate/host.py: a Llama's steps through the lab's own trainer at two widths, run in
these ranks by runs_in_ranks.py), then the fitted figures.

    torchrun --nproc-per-node 2 benchmarks/calibrate_device.py --out fsdp_lab/plan/devices/h200.json
    torchrun --nproc-per-node 2 benchmarks/calibrate_device.py --host-only --out fsdp_lab/plan/devices/h200.json \
        --host-rows h200-host-rows.jsonl   # each timed run kept as it ends: the same command again resumes
    torchrun --nproc-per-node 4 benchmarks/calibrate_device.py --collectives-only --out fsdp_lab/plan/devices/h200.json
    torchrun --nproc-per-node 2 benchmarks/calibrate_device.py --sustained-only --out fsdp_lab/plan/devices/h200.json
    python benchmarks/calibrate_device.py --refit --out fsdp_lab/plan/devices/h200.json   # CPU, no GPU

Rank 0 writes the table; every rank takes part in the collectives. `--host-only` measures the host
section alone into an existing table (its kernel sections price the host model's blocks, which the
host's figures are read by), for the rank count it runs on: the table keeps a host section per count,
and the plan reads the nearest (a host issues a step over more ranks slower). `--host-rows FILE` keeps
each timed run as it ends, and the same command again times only the runs the file lacks. `--quick`
(and a CPU machine) runs tiny shapes, each host run once for a few steps, to check the script itself
(about 6 minutes on a 2-core CPU). `--refit` measures nothing:
it fits the table's host and elementwise figures again from its stored measurements by the plan's
current trace (fsdp_lab/calibrate/refit.py), on any CPU, after a change in what the trace records.
`--collectives-only` measures the collectives alone: a table keeps the rows of every GPU count it
was calibrated on, and the plan prices a group by the rows of the nearest count. A GPU run also measures
what the GPUs hold of their burst matmul rate under their power limit, all at once for
`--sustained-seconds` (fsdp_lab/calibrate/sustained.py: the `sustained` section); `--sustained-only`
measures that alone into an existing table. Sections a run does
not measure (the collectives on one GPU, the hand-written `spec`) are kept from the existing --out
table."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from fsdp_lab.calibrate.elementwise import fit_elementwise
from fsdp_lab.calibrate.kernels import BURST, elementwise_blocks, measure_collectives, measure_kernels
from fsdp_lab.calibrate.sustained import measure_sustained, sustained_section


def host_step_times(world: int, quick: bool, rows_file: Path | None) -> tuple[dict[str, float], dict[str, float]]:
    """The host model's timed runs (fsdp_lab/calibrate/host.py) in these ranks: the host's seconds to issue
    a step and the step's seconds, by run (the medians of its rounds). With `rows_file`, each timed run's
    row is appended to it as it finishes and the runs it holds already are not timed again: a call cut
    off resumes."""
    from fsdp_lab.calibrate.host import host_runs, host_times, runs_left, step_times

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runs_in_ranks import run_all

    done = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file and rows_file.exists() else []

    def keep(row, rows):
        if rows_file and "error" not in row:
            with rows_file.open("a") as f:
                f.write(json.dumps(row) + "\n")

    rows = done + run_all(runs_left(host_runs(world, quick), done), on_row=keep)
    failed = [r for r in rows if "error" in r]
    if failed:
        raise RuntimeError(f"host runs failed: {failed}")
    return host_times(rows), step_times(rows)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="tiny shapes (checks the script; CPU)")
    p.add_argument("--host-only", action="store_true", help="measure the host section alone into the existing --out table")
    p.add_argument("--collectives-only", action="store_true",
                   help="measure the NCCL collectives alone over these ranks, beside the table's rows of other GPU counts")
    p.add_argument("--host-rows", type=Path, help="append each timed host run's row here, and skip the runs it holds (resumes a cut-off call)")
    p.add_argument("--refit", action="store_true", help="measure nothing: fit the --out table's figures again by the current trace")
    p.add_argument("--sustained-only", action="store_true",
                   help="measure the matmuls' sustained rate under the power limit alone into the existing --out table (GPU)")
    p.add_argument("--sustained-seconds", type=float, default=15,
                   help="seconds every GPU runs matmuls back to back for the sustained rate (default 15; --quick: 2)")
    args = p.parse_args()
    if args.sustained_only and not torch.cuda.is_available():
        p.error("--sustained-only: no GPU here; the sustained rate is what a GPU holds under its power limit")
    if args.refit:
        from fsdp_lab.calibrate.refit import refit

        out = Path(args.out)
        try:
            refitted = refit(json.loads(out.read_text()))
        except ValueError as e:
            p.error(f"--refit {out}: {e}")
        out.write_text(json.dumps(refitted, indent=1))
        return
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    out = Path(args.out)
    table = json.loads(out.read_text()) if out.exists() else {"name": name}  # what is not measured here is kept
    quick = args.quick or not cuda
    seconds = 2 if args.quick else args.sustained_seconds
    if args.collectives_only or args.sustained_only:  # one section measured into the existing table
        if args.collectives_only:
            measure_collectives(table, device, world, quick)
        else:
            table["sustained"] = sustained_section(measure_sustained(device, seconds), name, seconds)
        dist.destroy_process_group()
        if rank == 0:
            out.write_text(json.dumps(table, indent=1))
            print(json.dumps(table["collectives" if args.collectives_only else "sustained"]), flush=True)
        return
    if not args.host_only:
        table.update(torch=torch.__version__, measured=True)
        measure_kernels(table, device, rank, world, quick=quick)
        if cuda:  # after the bursts, which a GPU hot from the held phase would run slower
            table["sustained"] = sustained_section(measure_sustained(device, seconds), name, seconds)
        table["source"] = (f"measured on {name} x{world} (torch {torch.__version__}) by benchmarks/calibrate_device.py, kernels timed "
                           f"in bursts of {BURST} calls" + ("" if world > 1 else "; collectives kept from the table's earlier "
                                                            "calibration (one GPU cannot measure them)"))
    host_s, step_s = host_step_times(world, quick, args.host_rows)
    blocks: list[dict] = []
    if rank == 0:
        print(json.dumps({"host_step_s": host_s}), flush=True)
        if not args.host_only:  # after the host's runs: they are timed without the profiler ever started
            blocks = elementwise_blocks(device, quick=quick)
    dist.destroy_process_group()  # the plan's trace below runs on a fake process group of its own
    if rank == 0:
        from fsdp_lab.calibrate.host import fit_section, with_host_section
        from fsdp_lab.plan.device import Device

        # Each width's block priced on this table's kernel sections (measured above, or kept with --host-only).
        section = {**fit_section(host_s, Device(name, table), quick, step_s), "measured_on": f"{name} x{world}, torch {torch.__version__}"}
        table["host"] = with_host_section(table.get("host", {}), world, section)
        if not args.host_only and blocks:  # priced by the plan's trace, at this table's bandwidth
            table["elementwise"] = fit_elementwise(blocks, Device(name, table))
        out.write_text(json.dumps(table, indent=1))
        print(json.dumps({k: table[k] for k in ("name", "host") if k in table}), flush=True)


if __name__ == "__main__":
    main()
