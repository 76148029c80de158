"""Tensor parallel's all-reduce (64 MiB bf16: 8192 tokens x 4096) over 2 ranks, timed alone (one pair,
the other two GPUs idle) and with both pairs at once (as dp_shard 2 x tp 2 runs them), beside the table."""
import os, statistics, torch, torch.distributed as dist
dist.init_process_group("nccl"); r = dist.get_rank(); torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
mine = pairs[r // 2]
x = torch.ones(8192 * 4096, dtype=torch.bfloat16, device="cuda")
def timed(active):
    out = []
    for i in range(30):
        dist.barrier(); torch.cuda.synchronize()
        if r // 2 in active:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); dist.all_reduce(x, group=mine); b.record(); torch.cuda.synchronize()
            if i >= 5: out.append(a.elapsed_time(b))
    return statistics.median(out) if out else None
for name, active in (("one pair", {0}), ("both pairs", {0, 1}), ("one pair", {0})):
    t = timed(active)
    if r == 0: print(f"all_reduce 64 MiB over 2 ranks, {name}: {t:.3f} ms", flush=True)
if r == 0:
    from fsdp_lab.plan.device import load_device
    print(f"table: {load_device('h100-80gb').collective_s('all_reduce', 8192 * 4096 * 2, 2, False) * 1e3:.3f} ms")
dist.destroy_process_group()
