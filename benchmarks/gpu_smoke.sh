#!/usr/bin/env bash
# Every mesh and engine on this machine's GPUs, each printing its parity verdict, peak memory and speed.
# Usage: bash benchmarks/gpu_smoke.sh   (2 GPUs: 2-GPU layouts; 4+ GPUs: also hsdp 2x2, tp2d dp2xtp2, nd)
set -u
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
common="model=mlp_stack optim=sgd train.steps=10 logger=none"
runs=(
  "mesh=single $common"
  "mesh=ddp $common"
  "mesh=fsdp $common"
  "mesh=fsdp model=transformer ac=full checkpoint=dcp checkpoint.interval=5"
  "mesh=fsdp model=transformer fsdp.param_dtype=bfloat16 fsdp.reduce_dtype=float32 train.steps=10 logger=none"
  "mesh=hsdp $common"
  "mesh.engine=fsdp1 fsdp.sharding_strategy=full_shard $common"
  "mesh.engine=fsdp1 fsdp.sharding_strategy=shard_grad_op $common"
  "mesh.engine=fsdp1 fsdp.sharding_strategy=no_shard $common"
  "mesh=tp2d mesh.world_size=2 train.steps=10 logger=none"
  "mesh.pp=2 mesh.world_size=2 mesh.pp_schedule=1f1b train.microbatches=2 train.steps=10 logger=none"
  "+experiment=hsdp_accum mesh.world_size=2 train.steps=5 logger=none"
)
if [ "$gpus" -ge 4 ]; then
  runs+=("mesh=hsdp mesh.engine=fsdp1 $common" "mesh=tp2d mesh.sequence_parallel=true train.steps=10 logger=none"
         "mesh=nd mesh.world_size=4 mesh.pp_schedule=1f1b train.microbatches=2 train.steps=10 logger=none"
         "+experiment=hsdp_accum train.steps=5 logger=none")
fi
for r in "${runs[@]}"; do
  out=$(python3 -m fsdp_lab $r 2>&1); dir=$(echo "$out" | sed -n 's/^run dir: //p' | tail -1)
  python3 - "$dir" "$r" <<'PY'
import json, sys
d, r = sys.argv[1], sys.argv[2]
try:
    s = json.load(open(f"{d}/summary.json"))
except Exception as e:
    print(f"FAILED TO RUN  {r}: {e}"); sys.exit()
p, m, f = s.get("parity") or {}, s.get("memory") or {}, s.get("perf") or {}
print(f"{s['status']:7} parity_ok={p.get('ok')} dloss={p.get('max_loss_abs_diff', 0):.1e} dparam={p.get('max_param_abs_diff', 0):.1e} "
      f"peak={m.get('peak_mib', 0):.0f}MiB step={f.get('step_time_s') or 0:.4f}s world={s['world_size']} :: {r}"
      + (f"\n        error: {s['error']}" if s['status'] != 'ok' else ""))
PY
done
