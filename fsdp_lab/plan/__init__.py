"""mode=plan: predicted step time and memory of every way to shard a model on N GPUs, ranked.

trace.py (the estimate's fake-group trace, op by op) -> cost.py (ops priced on a device table,
device.py) + memory.py -> predict.py (per layout) -> search.py (the layouts, ranked) -> run.py (table,
plan.json) -> validate_runs.py (plan.validate=K: the best K run here)."""
