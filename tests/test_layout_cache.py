"""layout=auto's kept choices (fsdp_lab/layout_cache.py): a run with the same inputs takes the choice an
earlier one made without planning; any input that changes, plan.cache=false, a cache file that does not
read, or a model whose code the lab cannot see (model=custom) plans."""

from __future__ import annotations

import json

import pytest
import transformers

from fsdp_lab import layout_auto
from fsdp_lab.compose import compose_cfg, to_run_config
from fsdp_lab.layout_auto import apply_layout
from fsdp_lab.layout_cache import cache_dir, choice_key
from fsdp_lab.models import model_spec
from config_space import HF_ALWAYS, TINY_GPT

ON = ["debug=cpu_tiny", "layout=auto", "plan.device=h100-80gb", "plan.top=1"]
AUTO = [*ON, "plan.gpus=2"]


def chosen_by(*overrides: str) -> dict:
    return to_run_config(apply_layout(compose_cfg(*overrides), list(overrides))).layout_auto


@pytest.fixture
def plans(monkeypatch):
    """The calls into the plan layout=auto makes, counted."""
    calls = []
    planned = layout_auto.planned

    def counted(*args):
        calls.append(args)
        return planned(*args)

    monkeypatch.setattr(layout_auto, "planned", counted)
    return calls


def test_the_same_inputs_take_the_earlier_choice_without_planning(plans):
    first = chosen_by(*AUTO)
    again = chosen_by(*AUTO)
    assert len(plans) == 1 and not first["from_cache"] and again["from_cache"]
    assert again["chosen"] == first["chosen"] and again["predicted"] == first["predicted"]
    (kept,) = cache_dir().iterdir()
    assert json.loads(kept.read_text())["overrides"] == first["chosen"]["overrides"]


def test_a_changed_input_or_plan_cache_false_plans_again(plans):
    chosen_by(*AUTO)
    chosen_by(*AUTO, "train.seq_len=64")  # another input: another key
    chosen_by(*ON, "plan.gpus=4")  # other GPUs
    record = chosen_by(*AUTO, "plan.cache=false")
    assert len(plans) == 4 and not record["from_cache"]
    assert len(list(cache_dir().iterdir())) == 3, "plan.cache=false keeps nothing either"


def test_a_cache_file_that_does_not_read_plans_and_is_written_again(plans):
    first = chosen_by(*AUTO)
    (kept,) = cache_dir().iterdir()
    kept.write_text("{half a choi")
    again = chosen_by(*AUTO)
    assert len(plans) == 2 and not again["from_cache"] and json.loads(kept.read_text())["overrides"] == first["chosen"]["overrides"]


def test_a_model_whose_code_the_lab_cannot_see_is_never_kept():
    custom = to_run_config(compose_cfg("model=custom", *TINY_GPT))
    assert choice_key(custom, "h100-80gb", 2, {}) is None
    hf = to_run_config(compose_cfg("model=hf", "model.model_type=llama", *(f"model.config.{kv}" for kv in HF_ALWAYS["llama"])))
    assert choice_key(hf, "h100-80gb", 2, {}) is not None
    assert f"transformers {transformers.__version__}: " in model_spec("hf").outside_config(hf.model), "model=hf keys on its release too"


def test_float8_keys_on_torchao_s_release_and_a_missing_torchao_is_no_traceback(monkeypatch):
    import importlib.metadata

    run = to_run_config(compose_cfg("debug=cpu_tiny", "float8.recipe=tensorwise"))
    with_torchao = choice_key(run, "h100-80gb", 2, {})
    release = importlib.metadata.version

    def missing(name):
        if name == "torchao":
            raise importlib.metadata.PackageNotFoundError(name)
        return release(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert choice_key(run, "h100-80gb", 2, {}) not in (None, with_torchao)
