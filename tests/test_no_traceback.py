"""The modes that raised tracebacks where mode=train accepts the config (issue 40's table): each
either runs or is refused in one line, whichever the estimate and plan modules do today. (The
table's other kinds, user code's exceptions, names that resolve to nothing and faults that cannot
fire, are entries of the bad-input catalogue, tests/test_bad_input.py.)"""

from __future__ import annotations

import pytest

from config_space_check import accepted_or_refused, estimate_runs, plan_runs
from config_space_found import LLAMA

TINY = ["logger=none", "model.dim=16", "model.n_layers=2", "model.ffn_dim=32"]
ONE_GPU_PLAN = ["plan.gpus=1", "plan.gpus_per_node=1", "plan.top=1"]


def runs_or_is_refused_in_one_line(args: list[str]) -> None:
    checked = accepted_or_refused(args)  # a refusal of several lines or another exception fails here
    if checked is None:
        return
    run, dims = checked
    if run.mode == "estimate":
        estimate_runs(args, run, dims)
    else:
        plan_runs(args, run)


@pytest.mark.parametrize("args", [
    pytest.param([*TINY, "mode=estimate", "mesh.world_size=2", "ac=selective", "ac.selective=op"], id="estimate-op-selective-ac"),
    pytest.param([*TINY, "mode=estimate", "mesh.world_size=2", "ac=selective", "ac.selective=op", "ac.every=1"], id="estimate-op-selective-ac-every-block"),
    pytest.param(["logger=none", *LLAMA, "model.config.hidden_size=16", "model.config.num_attention_heads=2", "mode=plan", *ONE_GPU_PLAN], id="plan-hf"),
    pytest.param(["logger=none", "model=vit", "mode=estimate", "mesh.world_size=2"], id="estimate-vit"),
    pytest.param([*TINY, "mesh=nd", "mode=estimate", "mesh.world_size=8"], id="estimate-pp-tp"),
    pytest.param(["logger=none", "model=mlp", "mode=plan", *ONE_GPU_PLAN], id="plan-mlp"),
])
def test_a_mode_runs_or_refuses_in_one_line_where_train_accepts_the_config(not_a_rank, args):
    runs_or_is_refused_in_one_line(args)


@pytest.mark.slow  # in process, but a 64-GPU plan traces for minutes on 2 cores
def test_a_64_gpu_plan_at_seq_8192_runs_or_refuses_in_one_line(not_a_rank):
    runs_or_is_refused_in_one_line(["logger=none", "mode=plan", "plan.gpus=64", "train.seq_len=8192"])
