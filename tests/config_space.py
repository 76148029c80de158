"""The configuration space as hypothesis strategies, read from the schema (fsdp_lab/config.py): every
choice field's `allowed` values and one more, every bounded field's values on both sides of its limits,
each model family's own fields, the config groups (families, meshes, wrap policies, AC modes) and the
modes. An example is a list of overrides, `python -m fsdp_lab OVERRIDES` (tests/config_space_check.py
says what must come of it)."""

from __future__ import annotations

from dataclasses import fields, is_dataclass

from hypothesis import strategies as st

from fsdp_lab.config import RunConfig
from fsdp_lab.models import SPECS

# What the space never sets: where metrics go (W&B would reach for the network), paths, run names,
# timeouts (a hang would wait them out), how many processes trace a plan (the same figures by any
# count: tests/test_plan_side_by_side.py), and what the structure of an example draws (mode, family).
NOT_DRAWN = {"logger", "checkpoint.resume", "launch.timeout_s", "name", "mode", "model.name", "model.build", "model.model_type",
             "model.config_path", "model.config", "model.features", "hydra", "plan.workers"}
ALWAYS = ["logger=none"]

# A model of each family small enough to build, trace and train in well under a second.
TINY_GPT = ["model.build._target_=own_models.TinyGPT", "+model.build.vocab=64", "+model.build.dim=8", "+model.build.n_layer=2",
            "model.blocks=blocks", "model.vocab_size=64"]
FAMILIES = {
    "transformer": ["model=transformer", "model.dim=16", "model.n_layers=2", "model.ffn_dim=32"],
    "mlp": ["model=mlp"],
    "mlp_stack": ["model=mlp_stack"],
    "convnet": ["model=convnet", "model.dim=4", "model.image_size=8"],
    "vit": ["model=vit", "model.image_size=8"],
    "unused_input": ["model=unused_input"],
    "multi_traversal": ["model=multi_traversal", "model.n_layers=2"],
    "custom": ["model=custom", *TINY_GPT],
    "hf": ["model=hf"],
}
HF = {  # per model type: the config fields drawn, each from a few values (some that its validation refuses)
    "llama": {"hidden_size": [16, 30, 32], "num_attention_heads": [2, 4, 3], "num_key_value_heads": [1, 2], "num_hidden_layers": [1, 2],
              "intermediate_size": [32], "vocab_size": [256], "tie_word_embeddings": ["true", "false"], "hidden_sise": [16]},
    # qwen2's default of 32 key-value heads does not divide 2 attention heads: refused (it trained into a rank failure).
    "qwen2": {"hidden_size": [16, 32], "num_attention_heads": [2, 4], "num_key_value_heads": [1, 2, 32], "num_hidden_layers": [1, 2],
              "intermediate_size": [32], "vocab_size": [256]},
    "gpt2": {"n_embd": [16, 24], "n_head": [2, 4], "n_layer": [1, 2], "vocab_size": [256], "n_positions": [64], "n_inner": [32]},
}
HF_ALWAYS = {"llama": ["hidden_size=16", "num_attention_heads=2", "num_hidden_layers=2", "intermediate_size=32", "vocab_size=256"],
             "qwen2": ["hidden_size=16", "num_attention_heads=2", "num_key_value_heads=2", "num_hidden_layers=2", "intermediate_size=32", "vocab_size=256"],
             "gpt2": ["n_embd=16", "n_head=2", "n_layer=2", "vocab_size=256", "n_positions=64", "n_inner=32"]}
GROUPS = {
    "mesh": ["fsdp", "hsdp", "ddp", "nd", "single", "tp2d"],
    "wrap": ["block", "linear", "root", "size"],
    "ac": ["none", "full", "selective", "offload"],
    "optim": ["adam", "adamw", "sgd"],
    "checkpoint": ["none", "dcp"],
    "probes": ["default", "off"],
}
MODES = ["train", "train", "estimate", "estimate", "plan"]
# Names a user may give: some that exist in some family, some that exist nowhere.
NAMES = {
    "wrap.classes": ["[]", "[Linear]", "[TransformerBlock]", "[FeedForward]", "[Block]", "[LlamaDecoderLayer]", "[NoSuchBlock]"],
    "model.freeze": ["layers\\.0", "in_proj", "wte", "nothing", "layers", "'['"],
    "fault.module": ["layers.0", "layers.1.attention.wq", "output", "tok_embeddings", "inner.blocks.0", "nope"],
    "model.blocks": ["blocks", "wte", "layers", "null"],
    "model.layer_order": ["[0]", "[0,0,1]", "[1,0]", "[5]", "[]"],
    "checks": ["[parity_ok]", "[all_gather_per_step:4]", "[parity_okay]"],
    "fsdp.reshard_after_forward": ["true", "false", "2", "3", "maybe"],
    "plan.global_batch_tokens": ["null", "1024", "4K", "1000", "4Q"],
    "model.inputs": ["tokens", "features"],
}
# The examples' seed: fixed (not derived from a test's source, as hypothesis's derandomize does), so
# that editing a test does not change which configurations it tries.
SEED = 20261126
# Numbers drawn stay small: the models they size are built, traced and trained.
SMALL = 6


def schema_leaves(node, path: str = "") -> list[tuple[str, object, object]]:
    """(key, dataclass field, default) of every leaf of a schema node."""
    found = []
    for f in fields(node):
        value = getattr(node, f.name)
        if is_dataclass(value):
            found += schema_leaves(value, f"{path}{f.name}.")
        else:
            found.append((f"{path}{f.name}", f, value))
    return found


def _show(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


def values_of(key: str, f, default) -> st.SearchStrategy[str]:
    """The values drawn for one field, as override text: inside and outside its choices and limits."""
    if key in NAMES:
        return st.sampled_from(NAMES[key])
    allowed = f.metadata.get("allowed")
    if allowed:
        return st.sampled_from([*allowed, "bogus", *(["null"] if default is None else [])])
    limits = f.metadata.get("limits")
    if limits:
        ints = "int" in str(f.type)
        low = limits.get("ge", limits.get("gt", 0))
        high = limits.get("le")
        near = [low - 1, low, low + 1, low + 2] + ([high, high + 1] if high is not None else [low + SMALL])
        if not ints:
            near = [low - 0.5, low, low + 0.5, low + 1e-3] + ([high, high + 0.5] if high is not None else [low + 2.0])
        options = [int(v) if ints else v for v in near]
        return st.sampled_from([*options, *(["null"] if default is None else [])]).map(_show)
    if isinstance(default, bool) or "bool" in str(f.type):
        return st.sampled_from(["true", "false"])
    return st.nothing()  # a free-form field the space does not draw (NOT_DRAWN says why)


def _drawable(key: str, f, default) -> bool:
    return not any(key == k or key.startswith(k + ".") for k in NOT_DRAWN) and not values_of(key, f, default).is_empty


RUN_KEYS = [(k, f, d) for k, f, d in schema_leaves(RunConfig()) if not k.startswith("model.") and _drawable(k, f, d)]
FAMILY_KEYS = {
    name: [(f"model.{k}", f, d) for k, f, d in schema_leaves(spec.config()) if _drawable(f"model.{k}", f, d)]
    for name, spec in SPECS.items()
}


@st.composite
def overrides(draw, *, modes=MODES, max_keys: int = 6, families=tuple(FAMILIES)) -> list[str]:
    """One configuration: a family, config groups, a mode, then up to `max_keys` fields set."""
    family = draw(st.sampled_from(list(families)))
    out = [*ALWAYS, *FAMILIES[family]]
    if family == "hf":
        model_type = draw(st.sampled_from(sorted(HF)))
        out.append(f"model.model_type={model_type}")
        chosen = dict(kv.split("=") for kv in HF_ALWAYS[model_type])
        for key in draw(st.lists(st.sampled_from(sorted(HF[model_type])), max_size=2, unique=True)):
            chosen[key] = draw(st.sampled_from(HF[model_type][key]))
        out += [f"model.config.{k}={v}" for k, v in chosen.items()]
    for group in draw(st.lists(st.sampled_from(sorted(GROUPS)), max_size=2, unique=True)):
        out.append(f"{group}={draw(st.sampled_from(GROUPS[group]))}")
    mode = draw(st.sampled_from(list(modes)))
    if mode != "train":
        out.append(f"mode={mode}")
        if mode == "estimate":  # it needs the world size: most examples give it, some do not
            out.append(f"mesh.world_size={draw(st.sampled_from([1, 2, 4, 8]))}")
        if mode == "plan":
            out += ["plan.gpus=1", "plan.gpus_per_node=1", "plan.top=1"]
    given = {arg.split("=")[0].lstrip("+") for arg in out}  # Hydra refuses a key overridden twice
    keys = [k for k in RUN_KEYS + FAMILY_KEYS[family] if k[0] not in given]
    for key, f, default in draw(st.lists(st.sampled_from(keys), max_size=max_keys, unique_by=lambda k: k[0])):
        out.append(f"{key}={draw(values_of(key, f, default))}")
    return out


def command_line(args: list[str]) -> str:
    """The command that reproduces an example (model=custom imports tests/own_models.py)."""
    prefix = "PYTHONPATH=tests " if "model=custom" in args else ""
    return prefix + "python -m fsdp_lab " + " ".join(args)
