"""Predicted step time and peak memory of layouts of one run: the traces each activation-checkpointing
mode needs are taken once (they depend on neither the mesh nor the batch) and priced per layout."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from functools import cached_property

from fsdp_lab.config import ACConfig, RunConfig
from fsdp_lab.mesh import ParallelDims, degrees
from fsdp_lab.plan.cost import DTYPE_BYTES, TRACED_DEPTH, Layout, Model, step_time
from fsdp_lab.plan.device import Device
from fsdp_lab.plan.memory import peak_bytes
from fsdp_lab.plan.side_by_side import SideBySide
from fsdp_lab.plan.trace import ModelFacts, Trace, model_facts, trace_step


def traced_shapes(layers: int) -> list[tuple[int, int]]:
    """(blocks, samples) of the traces a model's cost and memory are read from: 2 blocks and
    min(layers, TRACED_DEPTH) at 1 and 2 samples; 1 block too where the model has no more than 2
    (plan/cost.Model.parts)."""
    deep = min(layers, TRACED_DEPTH)
    return list(dict.fromkeys([(2, 1), (2, 2), (deep, 1), (deep, 2), *([(1, 1)] if layers <= 2 else [])]))


class Predictor:
    def __init__(self, run: RunConfig, device: Device, gpus_per_node: int):
        self.run, self.device, self.gpus_per_node = run, device, gpus_per_node
        self._models: dict[str, Model] = {}
        self._traces: dict[tuple[str, tuple[int, int]], Trace] = {}  # (AC mode, (blocks, samples)) -> trace
        self.estimated_peaks: dict[Layout, float] = {}  # mode=estimate's peak per layout (MiB), as plan/fits.py reads it

    @cached_property
    def facts(self) -> ModelFacts:
        return model_facts(self.run)

    def take_traces(self, modes: Iterable[str], side: SideBySide | None = None) -> None:
        """The traces the cost model of each AC mode in `modes` reads, those not taken yet: side by side
        where `side` is given (plan.workers), else here."""
        todo = [(ac, shape) for ac in dict.fromkeys(modes) for shape in traced_shapes(self.facts.layers) if (ac, shape) not in self._traces]
        if not todo:
            return
        traced = (side or SideBySide(1)).map(trace_step, [(self.run, blocks, samples, ac) for ac, (blocks, samples) in todo])
        self._traces.update(zip(todo, traced))

    def model(self, ac: str) -> Model:
        if ac not in self._models:
            self.take_traces([ac])
            block, other = self.facts.block_params, self.facts.other_params
            f = self.run.fsdp
            param_dtype = f.param_dtype or "float32"
            layers = self.facts.layers
            self._models[ac] = Model(
                traces={shape: self._traces[ac, shape] for shape in traced_shapes(layers)},
                layers=layers, depth=min(layers, TRACED_DEPTH), block_params=block, other_params=other,
                param_bytes=DTYPE_BYTES[param_dtype], reduce_bytes=DTYPE_BYTES[f.reduce_dtype or param_dtype],
                seq_len=self.run.train.seq_len, clips=self.run.optim.max_norm is not None, float8_share=self.facts.float8_share,
                op_ac_share=op_ac_share(self.run.ac, ac), tp_all_reduces=self.facts.tp_all_reduces,
            )
        return self._models[ac]

    def predict(self, layout: Layout) -> dict:
        model = self.model(layout.ac)
        time = step_time(model, layout, self.device, self.gpus_per_node)
        return {**time, "peak_mib": peak_bytes(model, layout) / 2**20}


def op_ac_share(ac: ACConfig, mode: str) -> float:
    """Of a model's blocks, the share the op-level selective policy checkpoints when it runs under AC
    `mode` with the run's other AC settings: every ac.every-th block under ac=selective with
    ac.selective=op, none otherwise."""
    return 1 / ac.every if mode == "selective" and ac.selective == "op" else 0.0


def layout_of(run: RunConfig, world_size: int) -> Layout:
    """The layout a run's own config describes (mesh.dp_shard=-1 filled from world_size)."""
    m, t = run.mesh, run.train
    raf = run.fsdp.reshard_after_forward
    return Layout(**degrees(ParallelDims.from_mesh(m, world_size)), ac=run.ac.mode,
                  microbatches=t.microbatches, microbatch_size=t.batch_size // t.microbatches,
                  reshard=raf is not False, compile=run.model.compile, wrap_group=run.wrap.group)


def run_of(overrides: list[str]) -> RunConfig:
    """The run `python -m fsdp_lab OVERRIDES` configures (composed in this process)."""
    from fsdp_lab.compose import compose_run

    return compose_run(*overrides)


def predict_overrides(overrides: list[str], *, world_size: int, device: str, gpus_per_node: int) -> dict:
    """The prediction for `python -m fsdp_lab OVERRIDES` on world_size GPUs of `device`."""
    from fsdp_lab.plan.device import load_device

    run = run_of(overrides)
    traced = dataclasses.replace(run, model=dataclasses.replace(run.model, compile=False))
    # Configurations of one model share its traces, one per AC mode (Predictor.model): the AC settings
    # beside the mode (the selective policy, which blocks) and float8 are in the key, as they change those traces.
    ac_beside_mode = dataclasses.replace(traced.ac, mode="none")
    key = repr((traced.model, traced.fsdp.param_dtype, traced.fsdp.reduce_dtype, traced.train.seq_len, traced.optim, ac_beside_mode,
                traced.float8, device, gpus_per_node))
    if key not in _PREDICTORS:
        _PREDICTORS[key] = Predictor(traced, load_device(device), gpus_per_node)
    return _PREDICTORS[key].predict(layout_of(run, world_size))


_PREDICTORS: dict[str, Predictor] = {}
