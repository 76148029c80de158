"""What mode=estimate and mode=plan cannot do yet although mode=train accepts it, refused in one line
before they start instead of failing inside their trace (found by tests/test_config_space.py; the
estimate and plan modules may lift each limit, and then drop its check here)."""

from __future__ import annotations


from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.parallel.wrap import wrap_units
from fsdp_lab.models import model_spec
from fsdp_lab.models.depth import blocks_kept, cut_to_kept
from fsdp_lab.user_code import built_on_meta


def check_estimate_limits(run: RunConfig) -> None:
    m = run.mesh
    if m.pp > 1 and m.tp > 1:
        # Each pp rank is traced in a fake world of its own; the second one's tensor-parallel
        # collectives look up groups the first world registered ("Could not resolve the process group").
        raise ConfigError(f"mesh.tp={m.tp} with mesh.pp={m.pp} and mode=estimate: the estimate cannot trace tensor parallelism inside pipeline stages yet; allowed: mesh.tp=1 or mesh.pp=1")
    model = built_on_meta(run.model)
    for unit in wrap_units(model, run.wrap):
        methods = getattr(unit, "fsdp_forward_methods", ())
        if methods:
            # torch's FSDPMemTracker looks a unit up in its pre-backward hook by the forward it saw; a
            # unit entered through another method (register_fsdp_forward_method) was never seen: KeyError.
            raise ConfigError(
                f"wrap.policy={run.wrap.policy} with mode=estimate: it makes {type(unit).__name__} a unit, called through "
                f"{methods[0]}, which torch's FSDPMemTracker cannot follow; allowed: wrap.policy=root|linear|size"
            )


def check_plan_limits(run: RunConfig) -> None:
    """What mode=plan cannot take although a training run would."""
    if run.mesh.engine != "fsdp2":
        # Its candidates are FSDP2 layouts (meshes of dp_replicate x dp_shard x tp x pp), priced and estimated as such.
        raise ConfigError(f"mesh.engine={run.mesh.engine} with mode=plan: the planner lays out FSDP2 meshes; allowed: mesh.engine=fsdp2")
    layer_order = getattr(run.model, "layer_order", None)
    if layer_order is not None:
        # The planner traces the model at other depths (2 blocks, 1 block), where the order's indices do not exist.
        raise ConfigError(f"model.layer_order={layer_order} with mode=plan: the planner traces the model at other depths, which the order does not fit; allowed: model.layer_order=null")
    model = built_on_meta(run.model)
    if model_spec(run.model.name).with_blocks is None:
        with blocks_kept(1):  # the planner traces the model at a few blocks: the list must be cut
            try:
                cut_to_kept(model)
            except ValueError as e:
                raise ConfigError(f"model.name={run.model.name} with mode=plan: {e}; allowed: a model whose repeated blocks "
                                  "are one nn.ModuleList its forward walks") from None
