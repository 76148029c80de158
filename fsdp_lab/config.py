"""Typed schema of a run. Hydra composes `conf/` onto these dataclasses, so a misspelled key or a
wrong type fails at composition; `validate` then checks what types cannot express, before any rank
starts. Every field carries its documentation as the docstring below it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Optional


class ConfigError(ValueError):
    """A user's mistake in the configuration; printed as one line, exit code 2."""


def choice(default: Optional[str], *allowed: str):
    """A string field limited to `allowed` (OmegaConf cannot check `Literal`; `check_fields` does)."""
    return field(default=default, metadata={"allowed": allowed})


def bounded(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None):
    """A numeric field with its allowed range (None = unbounded on that side; null values pass)."""
    limits = {name: v for name, v in (("ge", ge), ("gt", gt), ("le", le)) if v is not None}
    return field(default=default, metadata={"limits": limits})


_LIMIT_TEXT = {"ge": ">= {}", "gt": "> {}", "le": "<= {}"}
_LIMIT_OK = {"ge": lambda v, x: v >= x, "gt": lambda v, x: v > x, "le": lambda v, x: v <= x}


def check_fields(node: Any, path: str = "") -> None:
    """Raise ConfigError for the first field outside its declared choices or limits."""
    for f in fields(node):
        value = getattr(node, f.name)
        key = f"{path}{f.name}"
        allowed = f.metadata.get("allowed")
        if allowed and value is not None and value not in allowed:
            raise ConfigError(f"{key}={value}: allowed are {', '.join(allowed)}")
        limits = f.metadata.get("limits", {})
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            broken = [name for name, x in limits.items() if not _LIMIT_OK[name](value, x)]
            if broken:
                rule = " and ".join(_LIMIT_TEXT[name].format(x) for name, x in limits.items())
                raise ConfigError(f"{key}={value}: allowed is {rule}")
        if is_dataclass(value):
            check_fields(value, f"{key}.")


DTYPES = ("float32", "bfloat16", "float16", "float64")


@dataclass
class ModelConfig:
    """What every model family's config has; each family (fsdp_lab/models/, conf/model/NAME.yaml)
    extends it with fields that mean one thing for that family."""

    name: str = "transformer"
    """Model family: a name registered in fsdp_lab/models/__init__.py (conf/model/NAME.yaml)."""
    compile: bool = False
    """torch.compile each block before sharding, and the loss (fsdp_lab.step.compiled_loss_fn)."""
    freeze: Optional[str] = None
    """Regex over parameter names; matching parameters get requires_grad=False (fine-tuning)."""


@dataclass
class MeshConfig:
    pp: int = bounded(1, ge=1)
    """Pipeline-parallel degree."""
    dp_replicate: int = bounded(1, ge=1)
    """Replicas of the data-parallel group (HSDP's outer dimension, DDP's degree)."""
    dp_shard: int = bounded(-1, ge=-1)
    """Shards within a replica (FSDP's degree); -1 takes what the world size leaves."""
    tp: int = bounded(1, ge=1)
    """Tensor-parallel degree."""
    engine: str = choice("fsdp2", "fsdp2", "fsdp1", "ddp")
    """fsdp2 = fully_shard, fsdp1 = FullyShardedDataParallel, ddp = DistributedDataParallel."""
    sequence_parallel: bool = False
    """With mesh.tp > 1 (transformer): norms and residual activations sharded along the sequence."""
    pp_schedule: str = choice("1f1b", "gpipe", "1f1b", "interleaved_1f1b")
    """Pipeline schedule when mesh.pp > 1; its microbatches are train.microbatches."""
    pp_stages_per_rank: Optional[int] = bounded(None, ge=1)
    """Pipeline stages each pp rank holds; null = 1, or 2 for interleaved_1f1b (which needs >= 2)."""
    world_size: Optional[int] = bounded(None, ge=1)
    """Ranks to spawn when dp_shard=-1; null = one per GPU, or mesh.cpu_world_size on CPU."""
    cpu_world_size: int = bounded(2, ge=1)
    """Ranks to spawn on CPU when world_size is null: 2 is the smallest world that shards; a preset
    whose mesh needs more (hsdp: 2 x 2) asks for them here without binding the GPU run's size."""


@dataclass
class FSDPConfig:
    reshard_after_forward: Any = True
    """true: free unsharded params after forward; false: keep them for backward; int: reshard to that
    smaller group size (must divide the shard group)."""
    param_dtype: Optional[str] = choice(None, *DTYPES)
    """Mixed-precision dtype for compute (all-gathered params); null = the parameters' dtype."""
    reduce_dtype: Optional[str] = choice(None, *DTYPES)
    """Dtype of gradient reduction; null = param_dtype."""
    cpu_offload: bool = False
    """Keep sharded params, grads and optimizer step on CPU (CPUOffloadPolicy)."""
    forward_prefetch: int = bounded(0, ge=0)
    """Blocks to all-gather ahead in forward (explicit prefetch); 0 = FSDP's implicit prefetch.
    fsdp1 prefetches at most one block: 1 sets its forward_prefetch."""
    backward_prefetch: int = bounded(0, ge=0)
    """Blocks to all-gather ahead in backward (explicit prefetch); 0 = FSDP's implicit prefetch."""
    root_backward_prefetch: bool = True
    """fsdp2: the root's backward (the output layer and the loss's gradient, a language model's memory
    peak) all-gathers the last unit ahead, as FSDP2 does by default; false: the last unit is gathered
    when its own backward starts, holding one unit's gathered weights less at that peak."""
    cast_forward_inputs: bool = True
    """fsdp2: every unit casts its floating-point forward inputs to param_dtype
    (MixedPrecisionPolicy.cast_forward_inputs); false: only the root does (the model's own inputs),
    and each unit takes what the modules before it produced. That spares the host a walk over every
    unit's inputs on every forward, where they already come in param_dtype (a transformer's blocks,
    fed by an embedding sharded in param_dtype); an input in another dtype then meets the unit's
    weights as it is."""
    post_optim_event: bool = False
    """fsdp2: after every optimizer.step record an event on the current stream and hand it to the root
    (set_post_optim_event): its next all-gathers wait on that event, not on the whole stream. CPU has
    no events (its ops run in order), so there the run trains as without."""
    symm_mem: bool = False
    """fsdp2, CUDA: all-gathers through NCCL symmetric memory (set_symm_mem_for_comm), the ranks'
    NCCL communicators under the zero-CTA policy (NCCL_CTA_POLICY=2, unless set), under which NCCL
    (2.28 on) may all-gather on one node with the GPUs' copy engines (on 2xH200 it did not spare the
    matmuls beside them: parallel/symm_mem.py). 1.016-1.025x at the 8B shape on 2 and 4 H200s
    (docs/benchmarks.md).
    CPU (gloo) has no symmetric memory, so there the run trains as without."""
    force_sum_reduction: bool = False
    """fsdp2: reduce gradients with sums only, dividing by the data-parallel size after the
    reduce-scatter rather than in it (set_force_sum_reduction_for_comms); with fsdp.symm_mem=true the
    reduce-scatters then also run through NCCL symmetric memory, whose reduce-scatter takes sums only
    (0.995x bf16 at the 8B shape on 4xH200 beside fsdp.symm_mem alone: docs/benchmarks.md)."""
    reduce_copy_in: str = choice("kernel", "kernel", "torch")
    """fsdp2: how each unit's gradients are cast and packed into its reduce-scatter input, on the
    compute stream before the reduce-scatter: kernel (one Triton kernel writing the bytes
    torch._chunk_cat writes, at 3.7-3.8 TB/s on an H200 where chunk_cat ran 0.45-2.0 TB/s:
    parallel/grad_pack.py) or torch (chunk_cat). The kernel takes exact casts of contiguous CUDA
    gradients (bf16 into a float32 reduce, or none) and leaves the rest, and CPU runs, to chunk_cat.
    1.024-1.035x a step on one H200, 1.024x for one rank of 4 at the 8B shape, collectives faked
    (docs/benchmarks.md)."""
    all_gather: str = choice("packed", "packed", "in_place")
    """fsdp2: where each unit's all-gather writes: packed (FSDP2's: one buffer, then every parameter
    copied out of it on the compute stream before the unit's forward) or in_place (each parameter
    gathered straight into its unsharded storage, the unit's gathers one coalesced collective: no
    copy-out; parallel/gather_in_place.py). Not with fsdp.symm_mem=true, whose gathers must write to
    symmetric memory. One rank of 4 at the 8B shape, collectives faked, on one H200: bf16 1.008-1.010x
    (1.035x resharded after forward), float8 within 1.5%, the losses the same; not yet timed on 2 or
    more GPUs (docs/benchmarks.md)."""
    cast_after_sharding: Optional[str] = choice(None, *DTYPES)
    """fsdp2: cast the sharded model with module.to(dtype) after fully_shard (the parity reference and
    the floating inputs alike); null = keep the parameters' dtype."""
    sharding_strategy: str = choice(
        "auto", "auto", "full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2"
    )
    """fsdp1's ShardingStrategy; auto = from the mesh and reshard_after_forward: hybrid_shard (or
    hybrid_shard_zero2 without resharding) when mesh.dp_replicate > 1, else full_shard (or shard_grad_op)."""
    use_orig_params: bool = False
    """fsdp1: expose the original parameters (views into the flat shard) to the optimizer and the user."""
    backward_prefetch_policy: str = choice("backward_pre", "backward_pre", "backward_post", "off")
    """fsdp1's BackwardPrefetch (fsdp2 takes explicit counts: fsdp.backward_prefetch)."""


@dataclass
class WrapConfig:
    policy: str = choice("block", "block", "linear", "root", "size", "classes")
    """Which modules get their own FSDP unit; the root is always wrapped."""
    min_params: int = bounded(100_000, ge=1)
    """For policy=size: smallest module (in parameters) that gets its own unit."""
    classes: list[str] = field(default_factory=list)
    """For policy=classes: module class names that get their own unit."""
    group: int = bounded(1, ge=1)
    """fsdp2: consecutive units of the policy, of one class (blocks with blocks; an embedding of
    policy=classes stays on its own), sharded together as one (fully_shard over the list of modules),
    all-gathered and reduce-scattered in one collective each: FSDP's host work per unit (copy-in,
    copy-out, launching the collectives, its hooks) is paid once per group, and a group's parameters
    are gathered at once. 1 = each unit on its own."""


@dataclass
class ACConfig:
    mode: str = choice("none", "none", "full", "selective", "offload")
    """Activation checkpointing: none, every block, every k-th block, or activations offloaded to CPU."""
    impl: str = choice("composable", "composable", "utils", "wrapper", "outer_wrapper", "manual")
    """checkpoint() from _composable, torch.utils.checkpoint, or checkpoint_wrapper, each applied before
    the engine: FSDP(checkpoint(block)); outer_wrapper = checkpoint_wrapper around the blocks the
    engine wrapped: checkpoint(FSDP(block)) (not with DDP); manual = the model's forward calls
    torch.utils.checkpoint.checkpoint (or enters save_on_cpu) around each block itself."""
    every: int = bounded(2, ge=1)
    """For mode=selective: checkpoint every k-th block (1 = all of them)."""
    selective: str = choice("layer", "layer", "op")
    """For mode=selective: layer = the chosen blocks recompute everything; op = they keep their matmul
    outputs and recompute the rest (an op-level selective checkpointing policy)."""
    reentrant: bool = False
    """For impl=utils/wrapper/outer_wrapper/manual with mode=full or selective=layer: the reentrant
    variant of torch.utils.checkpoint."""


@dataclass
class CheckpointConfig:
    kind: str = choice("none", "none", "dcp")
    """none, or torch.distributed.checkpoint of model + optimizer + step."""
    interval: int = bounded(10, ge=1)
    """Save every this many optimizer steps (and at the end)."""
    keep: int = bounded(2, ge=1)
    """Complete checkpoints kept; older ones are deleted."""
    resume: Optional[str] = None
    """null = start fresh; auto = newest complete checkpoint of this run dir; or a checkpoint PATH."""
    async_save: bool = False
    """Save with dcp.async_save, overlapping the write with training."""


@dataclass
class OptimConfig:
    name: str = choice("adamw", "adam", "adamw", "sgd")
    """Optimizer. SGD with momentum exposes gradient-averaging bugs that Adam's scale invariance hides."""
    lr: float = bounded(1e-3, gt=0)
    """Learning rate."""
    weight_decay: float = bounded(0.0, ge=0)
    """Weight decay."""
    momentum: float = bounded(0.9, ge=0, le=1)
    """Momentum (sgd)."""
    foreach: Optional[bool] = None
    """Multi-tensor implementation; null = torch's default."""
    max_norm: Optional[float] = bounded(None, gt=0)
    """Clip gradients to this total L2 norm, taken over every shard, tp slice and pipeline stage;
    null = no clipping (`grad/norm` is recorded either way)."""
    schedule: str = choice("constant", "constant", "linear", "cosine")
    """Learning-rate schedule after the warm-up: constant, linear decay or cosine decay towards 0."""
    warmup_steps: int = bounded(0, ge=0)
    """Steps of linear warm-up from lr/(warmup_steps+1) to lr before the schedule."""


@dataclass
class ParityProbeConfig:
    enabled: bool = True
    """Train a DDP reference on the same data and compare every step."""
    strict: bool = False
    """Fail the run when parity drifts past tolerance."""
    param_every: int = bounded(5, ge=1)
    """Compare parameters (local shards vs the reference) every this many steps, and at the end."""
    localize: bool = False
    """Snapshot the parameters before every step, so that when parity fails the failing step is
    replayed exactly and the first module whose output, then whose gradient, differs is named
    (parity_report.json/.md). Without it a failure replays the step on the parameters it left."""


@dataclass
class MemoryProbeConfig:
    enabled: bool = True
    """Record memory at each phase of every step."""
    tracker: str = choice("none", "none", "module")
    """module: a per-module breakdown of one step by torch's (FSDP)MemTracker (memory_breakdown.json/.md)."""
    tracker_step: int = bounded(2, ge=2)
    """For tracker=module: the optimizer step tracked (>= 2: step 1 is the warm-up that creates optimizer state)."""


@dataclass
class PerfProbeConfig:
    enabled: bool = True
    """Record step time, tokens/s and (GPU) MFU."""
    warmup_steps: int = bounded(2, ge=0)
    """Steps left out of the summary's step time."""


@dataclass
class CommProbeConfig:
    enabled: bool = False
    """Count the collectives of each step (CommDebugMode) into comm/<op>_count."""


@dataclass
class ProfileProbeConfig:
    enabled: bool = False
    """Record a window of steps with torch.profiler: every rank's trace (profile/trace_rank<R>.json, for
    Perfetto or chrome://tracing), rank 0's ops by self time (profile/ops.md) and the summary's profile
    section. The window holds each step's whole turn, the other probes' work after the step too, and
    its steps carry the profiler's overhead."""
    first_step: int = bounded(3, ge=1)
    """The window's first step (1-based; past the first steps, which allocate and compile)."""
    steps: int = bounded(2, ge=1)
    """Steps in the window."""


@dataclass
class ProbesConfig:
    parity: ParityProbeConfig = field(default_factory=ParityProbeConfig)
    memory: MemoryProbeConfig = field(default_factory=MemoryProbeConfig)
    perf: PerfProbeConfig = field(default_factory=PerfProbeConfig)
    comm: CommProbeConfig = field(default_factory=CommProbeConfig)
    profile: ProfileProbeConfig = field(default_factory=ProfileProbeConfig)


@dataclass
class LoggerConfig:
    kind: str = choice("wandb", "none", "wandb")
    """Where metrics go besides metrics.jsonl."""
    mode: Optional[str] = choice(None, "online", "offline", "disabled")
    """W&B mode; null = online when a W&B login is configured, else offline."""
    project: str = "fsdp_lab"
    """W&B project."""
    entity: Optional[str] = None
    """W&B entity (team or user)."""
    group: Optional[str] = None
    """W&B group; null = the sweep's name in multirun (its dir below `sweeps/`, or the dir's name)."""
    tags: list[str] = field(default_factory=list)
    """W&B tags."""
    init_timeout_s: float = bounded(30.0, gt=0)
    """Seconds W&B may take to start (online: reach the server) before the run goes on without it."""


@dataclass
class AccumConfig:
    sync: str = choice("every", "every", "last", "reduce_scatter_only")
    """When microbatch gradients are reduced: every microbatch; only on the last (FSDP2
    set_requires_gradient_sync, DDP/FSDP1 no_sync); or (HSDP) reduce-scatter every microbatch but
    all-reduce across replicas only on the last (set_requires_all_reduce)."""
    reshard_after_backward: bool = True
    """FSDP2: reshard parameters after each microbatch's backward (false keeps them unsharded until the
    last microbatch: more memory, fewer all-gathers)."""
    explicit_unshard: bool = False
    """FSDP2: all-gather every unit ahead of each microbatch with unshard(async_op=True)."""


@dataclass
class TrainConfig:
    steps: int = bounded(20, ge=1)
    """Optimizer steps."""
    batch_size: int = bounded(4, ge=1)
    """Samples per data-parallel rank per optimizer step (derived from global_batch_size when that is set)."""
    global_batch_size: Optional[int] = bounded(None, ge=1)
    """Samples per optimizer step over all data-parallel ranks; set, each rank takes
    global_batch_size / (mesh.dp_replicate x mesh.dp_shard) of them as its train.batch_size."""
    microbatches: int = bounded(1, ge=1)
    """Forward/backward passes per optimizer step; must divide batch_size."""
    seq_len: int = bounded(32, ge=1)
    """Tokens per sample (models with token inputs)."""
    seed: int = bounded(0, ge=0, le=2**23 - 1)
    """Seeds the weights (same on every rank) and the data (each sample by its global index)."""
    deterministic: bool = False
    """Deterministic GPU kernels (torch.use_deterministic_algorithms): repeatable runs, slower steps."""
    accum: AccumConfig = field(default_factory=AccumConfig)
    """Gradient accumulation over train.microbatches."""
    overlap_steps: bool = False
    """true: issue each step before reading the previous one's loss and gradient norm, so that the
    host runs a step ahead and the device does not wait at each step's start for the host's Python
    (FSDP's hooks); perf/step_time_s is then the time from one step's start to the next's. Steps stay
    apart before a checkpoint, at the end, and in runs where something after a step must see it
    finished: probes other than perf and memory, train.standalone_layer, fault.kill_rank."""
    standalone_layer: Optional[int] = bounded(None, ge=0)
    """mlp_stack: after each optimizer step, block N alone (a non-root FSDP unit) runs forward and
    backward on the step's batch, then a second optimizer step follows; null = off."""


@dataclass
class LaunchConfig:
    max_restarts: int = bounded(0, ge=0)
    """torch elastic restarts of a failed rank group (local spawning)."""
    timeout_s: int = bounded(300, ge=1)
    """Collective timeout: a hang ends the run with the stuck collective named instead of forever."""
    numa_binding: Optional[str] = choice(None, "node", "socket", "exclusive", "core-complex")
    """GPU runs whose ranks the lab starts (local spawning, the torchrun launcher's jobs): bind each rank's
    threads to the CPUs near its GPU (torch elastic's NUMA binding, as torchrun's --numa-binding);
    null = wherever the OS schedules them."""


@dataclass
class FaultConfig:
    kill_rank: Optional[int] = bounded(None, ge=0)
    """Rank that dies at fault.at_step (for testing recovery)."""
    at_step: Optional[int] = bounded(None, ge=0)
    """Steps done when fault.kill_rank dies: at the start of the next step, or while saving this step's
    checkpoint (fault.phase=save). Only the first attempt of a restarted run dies."""
    phase: str = choice("step", "step", "save")
    """step = dies before step at_step+1; save = dies after writing the shards of the checkpoint of
    step at_step, before it is made visible (for testing atomicity)."""
    kind: str = choice("kill", "kill", "raise", "hang", "corrupt_grad")
    """kill = SIGKILL (a hard crash), raise = an exception in the rank, hang = the rank stops
    calling collectives, so its peers time out (after launch.timeout_s); corrupt_grad = rank
    fault.kill_rank adds 1 to its gradients of fault.module's parameters in step at_step+1 (the run
    goes on: parity and its localisation report should find the module)."""
    module: Optional[str] = None
    """For kind=corrupt_grad: the module path whose parameters' gradients are corrupted (layers.1.attention.wq)."""


@dataclass
class SweepConfig:
    objective: Optional[str] = None
    """The figure a run returns to a Hydra sweeper (hydra/sweeper=optuna), read from its summary.json:
    final_loss, perf/tokens_per_s, perf/step_time_s, perf/mfu, memory/peak_mib, ... (fsdp_lab/objective.py);
    null = the run returns nothing. The direction is the sweeper's (hydra.sweeper.direction)."""


@dataclass
class PlanConfig:
    """mode=plan: rank the ways to shard the model on plan.gpus GPUs by predicted tokens/s."""

    gpus: int = bounded(8, ge=1)
    """GPUs to plan for (the world size of every candidate)."""
    gpus_per_node: int = bounded(8, ge=1)
    """GPUs per node: tensor parallelism stays within a node; collectives across nodes use the network.
    plan.gpus below it plan one node of plan.gpus GPUs."""
    device: str = choice("h100-80gb", "auto", "h100-80gb", "h200")
    """Device table (fsdp_lab/plan/devices/<device>.json): speeds, links, memory; auto = the table of
    the GPU in hand (refused where none is visible or it has no table)."""
    inter_node_gbps: Optional[float] = bounded(None, gt=0)
    """Bandwidth per GPU between nodes, GB/s; null = the device table's assumption (printed with the plan)."""
    global_batch_tokens: Any = None
    """Tokens per optimizer step over all GPUs (int, or with a K/M suffix: 4M); null = train.batch_size x
    train.seq_len per data-parallel rank of a pure FSDP layout."""
    max_microbatches: int = bounded(8, ge=1)
    """Largest train.microbatches tried."""
    search_compile: bool = True
    """Try compiled and eager blocks (model.compile); false: model.compile as configured."""
    memory_margin: float = bounded(0.10, ge=0)
    """What the caching allocator adds over the estimate's peak of live tensors (fragmentation, cached
    blocks, workspaces), as a fraction: a candidate fits when peak x (1 + margin) + estimate.reserved_mib
    is within the device's memory. 0.10: on 4xH100 a run the closed form put at 62.9 GiB ran out of
    memory with 73.4 GiB allocated of 79.2 (the allocator wanted over 7% more than its live tensors)."""
    top: int = bounded(15, ge=1)
    """Rows printed (plan.json keeps every candidate); each one shown as fitting has mode=estimate's peak."""
    workers: int = bounded(0, ge=0)
    """Processes that take the plan's traces side by side, one pool a plan (fsdp_lab/plan/side_by_side.py); 0 = one per CPU
    core where the traces are slow enough to gain by it (8B: seconds each), 1 = all in this process."""
    cache: bool = True
    """layout=auto takes the choice an earlier run with the same inputs made, instead of planning again
    (fsdp_lab/layout_cache.py); false plans afresh."""
    validate: int = bounded(0, ge=0)
    """Run the best K fitting candidates here (GPUs: plan.gpus of them) and add measured step time and peak."""
    validate_repeats: int = bounded(3, ge=1)
    """Runs of each validated candidate, alternating between them; the median step time is reported."""


@dataclass
class EstimateConfig:
    device: Optional[str] = choice(None, "h100-80gb", "h100-94gb", "h200", "a100-40gb", "a100-80gb")
    """mode=estimate: the GPU to fit on, by name; null = the visible GPU (none visible: no verdict)."""
    device_memory_gib: Optional[float] = bounded(None, gt=0)
    """The GPU's memory in GiB, over estimate.device (null = the device's)."""
    reserved_mib: float = bounded(1024.0, ge=0)
    """Device memory outside PyTorch's allocator: the CUDA context and NCCL's buffers."""
    workspace_mib: float = bounded(64.0, ge=0)
    """Library workspaces inside the allocator that no module owns (cuBLAS/cuBLASLt), added to the traced peak."""
    fragmentation: float = bounded(0.05, ge=0)
    """The allocator's reserve over its peak of live tensors (fragmentation, cached blocks), as a fraction."""


@dataclass
class Float8Config:
    """Float8 training with torchao (fsdp_lab/parallel/float8.py): nn.Linear layers swapped for
    torchao's Float8Linear before TP and FSDP, as torchtitan converts them."""

    recipe: str = choice("none", "none", "tensorwise", "rowwise")
    """none = bf16/fp32 linears; tensorwise = one scale per tensor (the fastest, and the one whose
    weights FSDP2 can all-gather in float8); rowwise = a scale per row (closer to bf16, slower)."""
    fsdp_all_gather: bool = False
    """tensorwise with FSDP2: cast the sharded weights to float8 before the all-gather (half bf16's
    bytes), their scales precomputed in one all-reduce after every optimizer step."""
    tp_scales: str = choice("tensor", "tensor", "shard")
    """tensorwise with mesh.tp > 1: tensor = one scale over each whole tensor, as torchao casts a DTensor
    (an all-reduce of its amax at every cast of a tensor-parallel shard); shard = each rank's shard its own
    scale, no collective beyond the TP plan's (fsdp_lab/parallel/float8_shard_scales.py)."""
    skip: list[str] = field(default_factory=lambda: ["output"])
    """Linears kept in high precision: a module whose name (as in the model, e.g. layers.0.attention.wq)
    equals or ends with `.`+an entry, or starts with an entry + `.`; the output projection by default,
    as torchtitan keeps it."""
    parity_tolerance: float = bounded(0.02, gt=0)
    """With a recipe: the loss drift from the high-precision DDP reference that parity accepts (the
    parameter and gradient-norm tolerance is 10x this, as for every dtype); float8 rounds to 3 mantissa bits."""


@dataclass
class RunConfig:
    """The root of a run's configuration (conf/config.yaml composes onto it)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    wrap: WrapConfig = field(default_factory=WrapConfig)
    ac: ACConfig = field(default_factory=ACConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    probes: ProbesConfig = field(default_factory=ProbesConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    estimate: EstimateConfig = field(default_factory=EstimateConfig)
    float8: Float8Config = field(default_factory=Float8Config)
    layout: str = choice("config", "config", "auto")
    """config = the mesh, AC, microbatches and resharding as configured; auto = before any rank starts,
    take the best fitting layout mode=plan predicts for the GPUs this run uses, keeping every key set
    on the command line (fsdp_lab/layout_auto.py)."""
    layout_auto: Optional[dict[str, Any]] = None
    """Set by layout=auto before the ranks start, not by users: what it chose (or why it kept the
    config's layout) and the plan's prediction; summary.json's `layout`."""
    device: str = choice("auto", "auto", "cpu", "cuda")
    """auto = CUDA + NCCL when GPUs are visible, else CPU + gloo."""
    mode: str = choice("train", "train", "estimate", "plan")
    """train = a real run; estimate = predict memory on a fake process group, one process; plan = rank
    the layouts for plan.gpus GPUs by predicted step time (fsdp_lab/plan/)."""
    name: str = "run"
    """A label for the run (W&B name, report rows)."""
    checks: list[str] = field(default_factory=list)
    """Verdicts rank 0 computes at the end into summary.json's checks{name: {ok, value, expected}}
    (fsdp_lab/checks.py): parity_ok, frozen_unchanged, phases_stable, optimizer_state_in_first_step,
    tracker_categories_sum_to_peak, tracker_accuracy (GPU), resumed, all_gather_per_step:N,
    reduce_scatter_per_step:N, all_reduce_per_step:N."""


def show(value) -> str:
    """A value as it is written in an override."""
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)
