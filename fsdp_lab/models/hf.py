"""model=hf: a Hugging Face transformers causal LM built from its config with random weights (nothing
is downloaded): `AutoConfig.for_model(model.model_type, **model.config)` or a local config.json
(`model.config_path`). Attention runs through torch's scaled_dot_product_attention (sdpa); the
blocks are the decoder layers; TP follows the model's own `base_model_tp_plan`."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from fsdp_lab.config import ConfigError, ModelConfig
from fsdp_lab.models import hf_families, pretrained
from fsdp_lab.models.foreign import ForeignModel, TokenInputs
from fsdp_lab.models.spec import ModelSpec, TPPlan
from fsdp_lab.models.tp_styles import ReplicatedInput

log = logging.getLogger("fsdp_lab")


@dataclass
class HFConfig(ModelConfig):
    name: str = "hf"
    model_type: Optional[str] = None
    """A transformers model_type (llama, qwen2, mistral, gemma, gpt_neox, ...): its config's defaults,
    with model.config on top."""
    config_path: Optional[str] = None
    """Instead of model_type: a local directory (or config.json) of a checkpoint; no weights are read."""
    config: dict[str, Any] = field(default_factory=dict)
    """Overrides of the transformers config (hidden_size, num_hidden_layers, ...)."""
    pretrained: Optional[str] = None
    """A local checkpoint directory (config.json + safetensors): its config (unless model_type or
    config_path is set) and its weights, each rank reading only the slices it holds."""


# The styles of base_model_tp_plan the lab applies; others (e.g. replicated norms) are refused.
TP_STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


def hf_config(cfg: HFConfig):
    """The transformers config, with sdpa attention."""
    from transformers import AutoConfig

    config_path = cfg.config_path or (cfg.pretrained if cfg.model_type is None else None)
    if (cfg.model_type is None) == (config_path is None):
        raise ConfigError(
            f"model.model_type={_show(cfg.model_type)}, model.config_path={_show(cfg.config_path)}: set exactly one "
            "(a transformers model type such as llama, or a directory holding a config.json; or model.pretrained=DIR alone)"
        )
    for key, path in (("config_path", cfg.config_path), ("pretrained", cfg.pretrained)):
        if path is not None and not Path(path).exists():
            raise ConfigError(f"model.{key}={path}: no such file or directory")
    try:
        if config_path is not None:
            config = AutoConfig.from_pretrained(config_path, local_files_only=True, **cfg.config)
        else:
            config = AutoConfig.for_model(cfg.model_type, **cfg.config)
    except Exception as e:  # noqa: BLE001 - a config class's own validation raises what it likes
        raise ConfigError(f"{_model_key(cfg)}: transformers cannot build its config ({_first_line(e)})") from None
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if isinstance(heads, int) and isinstance(kv_heads, int) and kv_heads > 0 and heads % kv_heads:
        # transformers leaves grouped-query heads unchecked: sdpa then fails inside the first forward.
        raise ConfigError(f"model.config.num_key_value_heads={kv_heads} (set, or {type(config).__name__}'s default): must divide "
                          f"model.config.num_attention_heads={heads}; allowed: a divisor of {heads}")
    config._attn_implementation = "sdpa"
    return config


def _first_line(e: BaseException) -> str:
    """The exception's first sentence (transformers' config validators nest the cause on a later line)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = lines[-1] if lines and lines[0].startswith("Class validation error") else (lines[0] if lines else type(e).__name__)
    return text.split(". ")[0]


def _show(value: str | None) -> str:
    return "null" if value is None else value


def _model_key(cfg: HFConfig) -> str:
    if cfg.model_type:
        return f"model.model_type={cfg.model_type}"
    return f"model.config_path={cfg.config_path}" if cfg.config_path else f"model.pretrained={cfg.pretrained}"


def decoder_layers(lm: nn.Module) -> str:
    """Path (from the causal LM) of its decoder layers: the ModuleList of its no-split modules."""
    split = set(getattr(lm, "_no_split_modules", None) or ())
    for name, module in lm.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) and type(module[0]).__name__ in split:
            return name
    lists = [name for name, m in lm.named_modules() if isinstance(m, nn.ModuleList) and len(m)]
    if len(lists) != 1:
        raise ConfigError(f"model.model_type={type(lm).__name__}: cannot tell its decoder layers among {lists}")
    return lists[0]


def build(cfg: HFConfig) -> ForeignModel:
    config = hf_config(cfg)
    reason = hf_families.refusal(config.model_type, config)
    if reason:
        raise ConfigError(f"{_model_key(cfg)}: {reason}")
    try:
        lm = _causal_lm(config)
    except ValueError as e:
        raise ConfigError(f"{_model_key(cfg)}: not a causal LM transformers can build ({str(e).splitlines()[0][:200]})") from None
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    n_layers = config.num_hidden_layers

    def attention_flops(seq_len: int) -> float:
        # Scores and weighted sum, forward + backward (PaLM appendix B).
        return 12.0 * n_layers * heads * head_dim * seq_len

    return ForeignModel(lm, decoder_layers(lm), TokenInputs(config.vocab_size), attention_flops, call_kwargs={"use_cache": False})


def _causal_lm(config) -> nn.Module:
    """The model with sdpa attention, or eager where its family has no sdpa path (softcapped or
    otherwise modified attention scores): both run in plain torch under every mesh."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    except ValueError as e:
        if "scaled_dot_product_attention" not in str(e):
            raise
    log.info("model.model_type=%s has no sdpa attention: eager attention", config.model_type)
    config._attn_implementation = "eager"
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager")


def init_module(model: nn.Module, module: nn.Module) -> None:
    model.inner._init_weights(module)


def tp_plan(cfg: HFConfig, sequence_parallel: bool) -> TPPlan:
    """The block entries of base_model_tp_plan (`layers.*.self_attn.q_proj: colwise`); the embeddings
    and the output stay replicated over tp (FSDP shards them over dp). A block's module holding several
    column-wise layers (`self_attn`: q, k and v) takes its input replicated, so that their gradients
    leave it in one all-reduce."""
    declared = getattr(hf_config(cfg), "base_model_tp_plan", None) or {}
    block: dict[str, object] = {}
    for path, style in declared.items():
        head, star, rest = path.partition(".*.")
        if star and style in TP_STYLES:
            block[rest] = TP_STYLES[style]()
    colwise_parents = Counter(path.rpartition(".")[0] for path, style in block.items() if isinstance(style, ColwiseParallel))
    block.update({parent: ReplicatedInput() for parent, n in colwise_parents.items() if n > 1 and parent and "." not in parent})
    return {}, block


# Config keys of randomness in a causal LM's forward (dropout, MoE router jitter, layer drop); a
# classifier's or a summary head's dropout never runs in it.
RANDOM_KEYS = ("dropout", "pdrop", "jitter", "layerdrop")
UNUSED_PREFIXES = ("classifier", "summary")


def forward_randomness(config) -> dict[str, float]:
    """The config's nonzero keys that draw random numbers in the forward."""
    return {
        key: value for key, value in sorted(config.to_dict().items())
        if isinstance(value, float) and value > 0 and any(k in key for k in RANDOM_KEYS) and not key.startswith(UNUSED_PREFIXES)
    }


def load(cfg: HFConfig, model: nn.Module) -> None:
    if cfg.pretrained is not None:
        model.pretrained_load = pretrained.load_local_shards(model, cfg.pretrained)


def check(cfg: HFConfig, run, dims, model: ForeignModel) -> None:
    if cfg.pretrained is not None:
        pretrained.check_keys(model, cfg.pretrained)
    if not dims.tp_enabled:
        return
    config = model.inner.config
    declared = getattr(config, "base_model_tp_plan", None) or {}
    if not declared:
        raise ConfigError(f"mesh.tp={dims.tp}: {_model_key(cfg)} declares no tensor-parallel plan (base_model_tp_plan); allowed: mesh.tp=1")
    other = sorted({style for style in declared.values() if style not in TP_STYLES})
    if other:
        raise ConfigError(f"mesh.tp={dims.tp}: {_model_key(cfg)}'s tensor-parallel plan uses {', '.join(other)}; the lab applies colwise and rowwise only; allowed: mesh.tp=1")
    for key in ("num_attention_heads", "num_key_value_heads"):
        n = getattr(config, key, None)
        if n and n % dims.tp:
            raise ConfigError(f"mesh.tp={dims.tp}: must divide model.config.{key}={n} (each rank computes whole heads)")
    random = forward_randomness(config)
    if random and run.probes.parity.enabled:
        raise ConfigError(
            f"mesh.tp={dims.tp}: {_model_key(cfg)} draws random numbers in its forward ({', '.join(f'{k}={v:g}' for k, v in random.items())}), "
            "and a tensor-parallel shard draws other masks than its parity reference; set them to 0 "
            f"({' '.join(f'model.config.{k}=0' for k in random)}) or probes.parity.enabled=false"
        )


def outside_config(cfg: HFConfig) -> str:
    """The transformers config as read (model_type's defaults, or a checkpoint's config.json) and the
    transformers release whose modeling code runs it."""
    import transformers

    return f"transformers {transformers.__version__}: {hf_config(cfg).to_json_string()}"


SPEC = ModelSpec(
    name="hf", config=HFConfig, build=build, init_module=init_module, tp_plan=tp_plan, manual_ac=False,
    tied=lambda cfg: bool(getattr(hf_config(cfg), "tie_word_embeddings", False)), tied_key="model.config.tie_word_embeddings",
    check=check, load=load, outside_config=outside_config,
)
