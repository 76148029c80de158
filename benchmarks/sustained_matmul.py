"""The 8B block's bf16 matmuls in bursts (as the device table times them) and then sustained for
seconds on every GPU at once (as a training step runs them), second by second with the SM clock and
power each GPU reports: whether a GPU holds its burst rate once its power limit bites
(fsdp_lab/calibrate/sustained.py measures; `calibrate_device.py --sustained-only` records the same
figure in a device table).

    torchrun --nproc-per-node 4 benchmarks/sustained_matmul.py [--seconds 15]

Each rank takes its own GPU. Rank 0 prints the power limits, then every rank's bursts, its seconds
and their rate over the bursts' (a device table's `sustained.matmul_fraction`)."""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from fsdp_lab.calibrate.sustained import held_over_bursts, measure_sustained, power_limits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=15)
    a = p.parse_args()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    ranks = measure_sustained(device, a.seconds)
    if dist.get_rank() == 0:
        print(power_limits(), flush=True)
        for rank, r in enumerate(ranks):
            print(f"rank {rank} bursts (TFLOP/s): {r['bursts']}", flush=True)
            print(f"rank {rank} sustained, per second: " + ", ".join(f"{x['tflops']} ({x['sm_mhz']} MHz, {x['watts']} W)" for x in r["seconds"]), flush=True)
            print(f"rank {rank} sustained over bursts: {held_over_bursts(r):.3f} (a device table's sustained.matmul_fraction)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
