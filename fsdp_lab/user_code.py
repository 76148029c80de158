"""The user's code the lab calls before any rank starts (a custom model's constructor, a transformers
config's own validation, a `_target_`'s arguments): whatever it raises becomes one ConfigError line
naming the key that led to it and the exception's message, never a traceback."""

from __future__ import annotations

from contextlib import contextmanager

from torch import nn

from fsdp_lab.config import ConfigError, ModelConfig


def innermost(e: BaseException) -> BaseException:
    """The exception at the bottom of `e`'s chain: what the user's code raised, under the wrappers
    (Hydra's InstantiationException, huggingface_hub's validation errors) that re-raised it."""
    while e.__cause__ is not None:
        e = e.__cause__
    return e


def describe(e: BaseException) -> str:
    """`Type: first line of the message` of the innermost exception."""
    cause = innermost(e)
    line = next((part.strip() for part in str(cause).splitlines() if part.strip()), "")
    return f"{type(cause).__name__}: {line}" if line else type(cause).__name__


@contextmanager
def from_user_code(key: str):
    """Run user code; any exception but the lab's own ConfigError becomes `key: Type: message`."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"{key}: {describe(e)}") from None


def model_key(cfg: ModelConfig) -> str:
    """The key (and value) that decides which code builds the model."""
    if cfg.name == "custom":
        return f"model.build._target_={cfg.build.get('_target_')}"
    if cfg.name == "hf":
        return f"model.config_path={cfg.config_path}" if cfg.config_path else f"model.model_type={cfg.model_type}"
    return f"model.name={cfg.name}"


def built_on_meta(cfg: ModelConfig) -> nn.Module:
    """The model with its parameters on the meta device; what its building raises is one line."""
    from fsdp_lab.models import build_meta  # the models import fsdp_lab.config, as this module does

    with from_user_code(model_key(cfg)):
        return build_meta(cfg)
