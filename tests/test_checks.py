"""The verdict functions (fsdp_lab/checks.py) judge what they claim: each passes on a run that shows
the behaviour and fails on one that does not. (Refused model.freeze and checks values: tests/test_bad_input.py.)"""

from __future__ import annotations

import pytest

from fsdp_lab.checks import CHECKS, COUNT_CHECKS, evaluate, parse
from fsdp_lab.config import ConfigError
from fsdp_lab.models.mlp import MLPStackConfig
from fsdp_lab.freeze import freeze, frozen_names, mixed_units
from fsdp_lab.models import build_model

PARITY = {"enabled": True, "ok": True, "tolerance": 1e-5, "param_tolerance": 1e-4, "max_loss_abs_diff": 0.0, "max_param_abs_diff": 1e-7}


def phases(start, after_bwd, after_step, **rest):
    return {"memory/start_mib": start, "memory/after_bwd_mib": after_bwd, "memory/after_step_mib": after_step, **rest}


# What the optimizer state does in PyTorch's memory test: +2 (Adam's moments) in step 1, kept after.
STABLE = [phases(1.0, 1.5, 3.5), phases(3.0, 3.5, 3.5), phases(3.0, 3.5, 3.5)]


def test_parity_ok_follows_the_parity_verdict():
    assert CHECKS["parity_ok"]({"parity": PARITY}, [])["ok"] is True
    assert CHECKS["parity_ok"]({"parity": {**PARITY, "ok": False, "max_loss_abs_diff": 0.3}}, [])["ok"] is False
    assert CHECKS["parity_ok"]({"parity": {"enabled": False}}, [])["ok"] is False


def test_frozen_unchanged_needs_a_bitwise_match_of_something():
    check = CHECKS["frozen_unchanged"]
    assert check({"frozen": {"params": 3, "compared_numel": 51, "max_abs_change": 0.0}}, [])["ok"] is True
    assert check({"frozen": {"params": 3, "compared_numel": 51, "max_abs_change": 1e-9}}, [])["ok"] is False
    assert check({"frozen": {"params": 3, "compared_numel": 0, "max_abs_change": 0.0}}, [])["ok"] is False
    assert check({}, [])["ok"] is False


def test_phases_stable_fails_when_an_iteration_after_the_first_differs():
    check = CHECKS["phases_stable"]
    assert check({}, STABLE) == {"ok": True, "value": 0.0, "expected": 0.0}
    leaking = STABLE[:2] + [phases(3.25, 3.5, 3.5)]
    assert check({}, leaking) == {"ok": False, "value": 0.25, "expected": 0.0}
    assert check({}, STABLE[:2])["ok"] is False  # two iterations cannot show stability
    # A step's peak is no phase (on CPU it may count a collective's buffer on its way out); on GPU the
    # reserved memory at each phase is one.
    assert check({}, [dict(r, **{"memory/peak_mib": 4.0 + i / 8}) for i, r in enumerate(STABLE)])["ok"] is True
    reserved = [dict(r, **{"memory/after_bwd_reserved_mib": 8.0 + (i == 2)}) for i, r in enumerate(STABLE)]
    assert check({}, reserved) == {"ok": False, "value": 1.0, "expected": 0.0}


def test_optimizer_state_in_first_step_fails_without_state_or_when_it_does_not_stay():
    check = CHECKS["optimizer_state_in_first_step"]
    assert check({}, STABLE) == {"ok": True, "value": 2.0, "expected": 2.0}
    stateless = [phases(1.0, 1.5, 1.5), phases(1.0, 1.5, 1.5)]
    assert check({}, stateless)["ok"] is False
    freed = [phases(1.0, 1.5, 3.5), phases(1.0, 1.5, 3.5)]
    assert check({}, freed)["ok"] is False
    # Measured on 2 x H200 (torch_fsdp_memory): 0.0498 MiB of Adam state, 1.5 KiB more kept from step 1.
    lazy_init_blocks = [phases(65.0390, 65.0570, 65.1068), phases(65.0903, 65.1083, 65.1581)]
    assert check({}, lazy_init_blocks)["ok"] is True
    assert check({}, [phases(1.0, 1.5, 1.6), phases(1.2, 1.7, 1.8)])["ok"] is False  # 0.1 MiB created, 0.2 kept
    assert check({}, [{}])["ok"] is False


def test_collective_counts_must_match_on_every_step():
    check = COUNT_CHECKS["all_gather_per_step"]
    rows = [{"comm/all_gather_count": 3}, {"comm/all_gather_count": 3}]
    assert check({}, rows, "3") == {"ok": True, "value": 3, "expected": 3}
    assert check({}, rows, "4")["ok"] is False
    assert check({}, rows + [{"comm/all_gather_count": 6}], "3")["ok"] is False
    assert check({}, [{"loss": 1.0}], "3")["ok"] is False


def test_tracker_checks():
    sums = CHECKS["tracker_categories_sum_to_peak"]
    memory = {"tracker_peak_mib": 3.0, "tracker_peak_categories_mib": {"Parameter": 1.0, "Activation": 2.0}}
    assert sums({"memory": memory}, [])["ok"] is True
    assert sums({"memory": {**memory, "tracker_peak_mib": 4.0}}, [])["ok"] is False
    accuracy = CHECKS["tracker_accuracy"]
    assert accuracy({"memory": {"tracker_accuracy": None}}, [])["ok"] is None  # CPU: nothing to compare with
    assert accuracy({"memory": {"tracker_accuracy": 0.97}}, [])["ok"] is True
    assert accuracy({"memory": {"tracker_accuracy": 0.8}}, [])["ok"] is False


def test_evaluate_keys_verdicts_by_spec_and_parse_refuses_unknown_checks():
    out = evaluate(["phases_stable", "all_gather_per_step:3"], {}, [dict(r, **{"comm/all_gather_count": 3}) for r in STABLE])
    assert set(out) == {"phases_stable", "all_gather_per_step:3"} and all(v["ok"] for v in out.values())
    for bad in ("no_such_check", "all_gather_per_step", "all_gather_per_step:x", "parity_ok:1"):
        with pytest.raises(ConfigError, match=f"checks={bad}: allowed are parity_ok"):
            parse(bad)


def test_freeze_matches_names_and_finds_units_mixing_frozen_and_trainable():
    model = build_model(MLPStackConfig(dim=5, ffn_dim=7, n_layers=2), seed=0)
    assert frozen_names(model, "in_proj") == [f"layers.{i}.in_proj.{p}" for i in (0, 1) for p in ("weight", "bias")]
    assert mixed_units(model, list(model.layers), "in_proj") == ["layers.0", "layers.1"]
    linears = [m for layer in model.layers for m in (layer.in_proj, layer.out_proj)]
    assert mixed_units(model, linears, "in_proj") == []
    assert mixed_units(model, [], r"layers\.0\.") == ["(root)"]
    initial = freeze(model, "in_proj")
    assert list(initial) == frozen_names(model, "in_proj")
    assert [n for n, p in model.named_parameters() if not p.requires_grad] == list(initial)
