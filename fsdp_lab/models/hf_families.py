"""The causal-LM families of the pinned transformers (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`) under
model=hf: for each, a tiny config built from its own config class (the sizes found generically by
the names configs give them, a few per-family overrides where that is not enough), and the reason
the lab refuses the families it cannot run, given before any rank starts. benchmarks/hf_families.py
runs the matrix and writes docs/hf_families.md."""

from __future__ import annotations

import json

# Tiny sizes, each under every name a config class gives it; set where the family's config has the key.
TINY_SIZES: dict[tuple[str, ...], int] = {
    ("hidden_size", "n_embd", "d_model", "n_embed"): 32,
    ("intermediate_size", "ffn_dim", "ffn_hidden_size", "d_ff", "decoder_ffn_dim", "encoder_ffn_dim"): 64,
    ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "decoder_layers", "encoder_layers"): 2,
    ("num_attention_heads", "n_head", "n_heads", "num_heads", "decoder_attention_heads", "encoder_attention_heads"): 4,
    ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"): 2,
    ("head_dim", "kv_channels", "v_head_dim", "qk_rope_head_dim", "qk_nope_head_dim", "linear_head_dim", "index_head_dim"): 8,
    ("qk_head_dim",): 16,  # qk_nope_head_dim + qk_rope_head_dim (multi-head latent attention)
    ("rotary_dim",): 4,
    ("linear_num_heads", "index_n_heads"): 4,
    ("index_topk",): 4,
    ("kv_lora_rank", "q_lora_rank"): 16,
    ("vocab_size",): 128,
    ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length"): 64,
    ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"): 4,
    ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k"): 2,
    ("moe_intermediate_size", "shared_expert_intermediate_size", "shared_experts_intermediate_size", "expert_intermediate_size"): 32,
    ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts", "n_group", "num_expert_group", "topk_group",
     "first_k_dense_replace", "num_dense_layers", "moe_layer_start_index"): 1,
}
TINY_VOCAB = 128

# What the generic sizes miss, per family (model.config keys).
OVERRIDES: dict[str, dict] = {
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "zaya": {"num_experts_per_tok": 1},  # the only value it supports
}

# Families refused for a reason the generic checks (`refusal`) do not see, found by benchmarks/hf_families.py.
_CONSTRUCTOR_INIT = ("its _init_weights leaves {} at its constructor's values, which a meta-device build does not keep: "
                     "the sharded model and its parity reference would start from different weights")
_UNUSED = ("its forward leaves parameters without gradients at tiny sizes ({}), which DDP, the parity reference, refuses "
           "(find_unused_parameters is off)")
_PER_LAYER_HEADS = "its attention shapes vary by layer (head_dim is per layer): the lab's FLOPs and TP checks need one head_dim"
REFUSED: dict[str, str] = {
    "apertus": _CONSTRUCTOR_INIT.format("the xIELU activation's alpha_p, alpha_n"),
    "apertus1p5_text": _CONSTRUCTOR_INIT.format("the xIELU activation's alpha_p, alpha_n"),
    "data2vec-text": _CONSTRUCTOR_INIT.format("lm_head.bias"),
    "axk2": _UNUSED.format("routed experts"),
    "big_bird": _UNUSED.format("block-sparse attention's unused projections"),
    "deepseek_v32": _UNUSED.format("the sparse-attention indexer"),
    "deepseek_v4": _UNUSED.format("the sparse-attention indexer"),
    "dots3_note_text": _UNUSED.format("the sparse-attention indexer"),
    "glm_moe_dsa": _UNUSED.format("the sparse-attention indexer"),
    "hy_v4": _UNUSED.format("routed experts"),
    "inkling2_loop_text": _UNUSED.format("looped layers"),
    "gemma4_text": _PER_LAYER_HEADS,
    "gemma4_unified_text": _PER_LAYER_HEADS,
    "cohere_compass_text": "transformers cannot build it from its own config class's layer types (KeyError: 'full_attention')",
    "lfm2_moe": "its config class leaves layer_types unset: it builds only from a checkpoint's config.json",
    "reformer": "chunked LSH attention over fixed chunk lengths (is_decoder=True required): not a plain causal LM",
    "xlstm": "xLSTM recurrent blocks (no attention heads): recurrent families are not validated under sharding",
    "xmod": "needs a language adapter chosen (set_default_language) before its forward",
    "trocr": _UNUSED.format("its learned positions' unused rows"),
    "xlnet": _UNUSED.format("the two-stream attention's query stream"),
    "qwen3_next": "parity fails on fsdp (Δloss 1.6e-3 at step 1, ddp holds): its gated delta-net layers diverge when sharded (not yet diagnosed)",
    "qwen4_exp_text": "parity fails on ddp against ddp (Δloss 7.9e-5 at step 1): its forward is not deterministic run to run",
    "longcat_flash": "a 2-rank run aborts in gloo: the ranks' collectives mismatch (its zero-computation experts)",
}


# Config keys of state-space / recurrent layers (Mamba and its hybrids, RWKV, xLSTM).
RECURRENT_PREFIXES = ("mamba_", "ssm_", "state_size", "rescale_every", "num_blocks_per_layer")


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _default_config(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]()


def tiny_config(model_type: str) -> dict:
    """model.config for a tiny member of the family: its own config's keys, at tiny sizes ({} where
    its config class cannot build its own defaults: the lab refuses it, naming why)."""
    try:
        defaults = _default_config(model_type).to_dict()
    except Exception:  # noqa: BLE001 - a config class's own validation raises what it likes
        return {}
    out = {key: value for keys, value in TINY_SIZES.items() for key in keys if key in defaults and _is_size(defaults[key])}
    kv, heads = defaults.get("num_key_value_heads"), defaults.get("num_attention_heads")
    if kv is not None and kv == heads:  # multi-head (not grouped-query) attention: some families require it (latent attention)
        out["num_key_value_heads"] = out["num_attention_heads"]
    for key, value in defaults.items():  # special tokens must be ids of the tiny vocabulary
        if key.endswith("_token_id") and isinstance(value, int) and value >= TINY_VOCAB:
            out[key] = TINY_VOCAB - 1
    return {**out, **OVERRIDES.get(model_type, {})}


def tiny_overrides(model_type: str) -> list[str]:
    """The command-line overrides of a tiny member of the family (model=hf at tiny_config)."""
    return ["model=hf", f"model.model_type={model_type}", *(f"model.config.{k}={json.dumps(v)}" for k, v in tiny_config(model_type).items())]


def _is_size(value) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def refusal(model_type: str | None, config) -> str | None:
    """Why the lab cannot run this causal LM (one line), or None."""
    if model_type in REFUSED:
        return REFUSED[model_type]
    nested = sorted(getattr(type(config), "sub_configs", None) or ())
    if nested:
        text = f"{model_type}_text"
        instead = f"; its text model is model.model_type={text}" if text in causal_lm_types() else ""
        return f"a composite (multimodal) model: its config nests {', '.join(nested)}; the lab trains text-only causal LMs{instead}"
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder model; the lab trains decoder-only causal LMs"
    recurrent = sorted(k for k in config.to_dict() if k.startswith(RECURRENT_PREFIXES))
    if recurrent:
        return (f"state-space (recurrent) layers ({', '.join(recurrent[:3])}, ...): their torch fallback is not validated under "
                "sharding, and runs for minutes at the family's own state sizes")
    return None
