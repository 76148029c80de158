"""The parity reference in a plan: it is the whole model on every rank whatever the layout, so it
refuses no layout (on a GPU host the check would read the GPU in hand, not the planned one: an 8B plan
on 4×H100 listed 0 candidates); where it cannot fit on the planned GPU, the plan says so once and its
command lines turn it off."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fsdp_lab.compose import compose_run
from fsdp_lab.plan.run import PARITY_OFF, command_line, parity_note
from fsdp_lab.plan.search import Candidate, layouts

MODEL = ["model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.ffn_dim=128", "model.vocab_size=256", "train.seq_len=64", "logger=none"]
PLAN_4 = ["mode=plan", "plan.gpus=4", "plan.gpus_per_node=4", "plan.device=h100-80gb"]


def test_a_reference_too_big_for_the_gpu_in_hand_refuses_no_layout(monkeypatch):
    run = compose_run(*MODEL, *PLAN_4)
    assert run.probes.parity.enabled
    # A GPU in hand of 1 MiB: no reference fits on it, and the planned H100s are not it.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *_: SimpleNamespace(total_memory=2**20, name="tiny"))
    found = layouts(run, samples=8)
    assert {(lay.dp_shard, lay.tp) for lay in found} >= {(4, 1), (2, 2)}


def test_the_command_lines_turn_off_a_reference_that_cannot_fit():
    run = compose_run(*MODEL, *PLAN_4)
    h100 = 80 * 2**30
    note = parity_note(run, params=8_000_000_000, memory_bytes=h100)  # 8B x 16 bytes: 119 GiB
    assert note and "119 GiB" in note and PARITY_OFF in note
    assert parity_note(run, params=1_000_000_000, memory_bytes=h100) is None  # 15 GiB: it fits, left on
    off = compose_run(*MODEL, *PLAN_4, "probes.parity.enabled=false")
    assert parity_note(off, params=8_000_000_000, memory_bytes=h100) is None  # already off: nothing to say

    candidate = Candidate(layouts(run, samples=8)[0], {}, True, 0.0, 0.0)
    assert command_line(MODEL, candidate, {"parity": note}).endswith(PARITY_OFF)
    assert PARITY_OFF not in command_line(MODEL, candidate, {"parity": None})
    assert compose_run(*command_line(MODEL, candidate, {"parity": note}).split()[3:]).probes.parity.enabled is False
