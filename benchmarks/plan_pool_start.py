"""What a pool of 2 spawned processes adds to two tiny mode=estimate traces: their time in a pool,
less their time in this process (warm: the imports and first trace done)."""
import time

from fsdp_lab.compose import compose_run
from fsdp_lab.plan.cost import Layout
from fsdp_lab.plan.fits import estimated_peak_mib
from fsdp_lab.plan.side_by_side import SideBySide

if __name__ == "__main__":
    run = compose_run("model.dim=32", "model.n_layers=4", "model.n_heads=4", "model.ffn_dim=64", "model.vocab_size=128",
                      "train.seq_len=16", "logger=none", "float8.recipe=tensorwise")
    layout = Layout(pp=1, dp_replicate=1, dp_shard=2, tp=1, ac="none", microbatches=1, microbatch_size=1, reshard=True)
    calls = [(run, layout, 4)] * 2
    here_only = SideBySide(1)
    here_only.map(estimated_peak_mib, calls)  # warm
    start = time.perf_counter()
    here_only.map(estimated_peak_mib, calls)
    here = time.perf_counter() - start
    with SideBySide(2) as side:
        start = time.perf_counter()
        side.map(estimated_peak_mib, calls)
        pooled = time.perf_counter() - start
    print(f"2 traces here {here:.2f} s, in a pool of 2 {pooled:.2f} s: the pool adds {pooled - here / 2:.2f} s")
