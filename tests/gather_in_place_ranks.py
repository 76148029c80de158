"""Run by tests/test_gather_in_place.py as 4 real gloo ranks (torch elastic): every layout trains 3 steps
with FSDP2's packed all-gather and with fsdp.all_gather=in_place from the same seed; rank 0 prints, as
JSON, each layout's rows by mode and how many unit gathers went in place."""

import json
import sys

import torch.distributed as dist

from fsdp_lab.compose import prepared
from fsdp_lab.dist import init_distributed
from fsdp_lab.parallel import gather_in_place
from fsdp_lab.worker import build_trainer

LAYOUTS = {  # all on 4 ranks; blocks 4 and the vocabulary 257 rows, which 4 ranks split unevenly (padding)
    "fsdp bf16": ["mesh=fsdp", "fsdp.param_dtype=bfloat16", "fsdp.reduce_dtype=float32"],
    "kept gathered, 2 blocks a unit, explicit prefetch": ["mesh=fsdp", "fsdp.reshard_after_forward=false", "wrap.group=2",
                                                          "fsdp.forward_prefetch=1", "fsdp.backward_prefetch=1"],
    "resharded to 2 ranks after forward, full AC": ["mesh=fsdp", "fsdp.reshard_after_forward=2", "ac=full"],
    "hsdp": ["mesh=hsdp"],
    "tp2d": ["mesh=tp2d"],
}

counted = {"in_place": 0, "packed": 0}
lab_gather = gather_in_place.all_gather_in_place


def counting(*args):
    result = lab_gather(*args)
    counted["in_place" if isinstance(result, gather_in_place.GatheredInPlace) else "packed"] += 1
    return result


gather_in_place.all_gather_in_place = counting  # what use() installs from now on
ctx = init_distributed("cpu", timeout_s=120)
report = {}
for name, overrides in LAYOUTS.items():
    rows = {}
    for mode in ("packed", "in_place"):
        run, dims = prepared("debug=cpu_tiny", "probes=off", "train.steps=3", "model.n_layers=4", "model.vocab_size=257",
                             *overrides, f"fsdp.all_gather={mode}")
        got = []
        build_trainer(run, dims, ctx, on_step=lambda row: got.append([row["loss"], row["grad/norm"]])).run()
        rows[mode] = got
    report[name] = {"rows": rows, "gathers": dict(counted)}
    counted.update(in_place=0, packed=0)
if ctx.rank == 0:
    print("REPORT " + json.dumps(report))
sys.stdout.flush()
dist.destroy_process_group()  # left to the interpreter's exit, a gloo rank may abort in its threads (torch 2.11)
