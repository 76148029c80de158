"""The catalogue of mistakes users make, each refused before any rank starts: non-zero exit, one
clear line naming the key, the value and what is allowed, no traceback, no run dir left behind.
Grow the table with every new knob.

Every entry is refused by the same code the CLI runs (Hydra composition, then `validate.prepare`),
checked in-process; one entry of each kind of refusal also goes through the real CLI, which adds the
exit code, the one-line output and the absent run dir (a process costs seconds of torch import)."""

from __future__ import annotations

from dataclasses import fields, is_dataclass

import pytest

from fsdp_lab.config import ModelConfig, RunConfig
from in_process import run_lab_here
from fsdp_lab.cli_process import run_lab

pytestmark = pytest.mark.bad_input

# (overrides, the line the user sees). Hydra's own composition errors (unknown group option, type)
# come from Hydra and are printed by it; ours start with "error: ".
LLAMA = "model=hf model.model_type=llama model.config.num_hidden_layers=2 model.config.intermediate_size=32 model.config.vocab_size=256"
GPT = "model=custom model.build._target_=own_models.TinyGPT +model.build.vocab=64 +model.build.dim=8 +model.build.n_layer=1"

CATALOGUE = [
    ("train.steps=0", "error: train.steps=0: allowed is >= 1"),
    ("+experiment=torch_fsdp_checkpoint checkpoint=dcp", "error: checkpoint.kind=dcp with mesh.engine=fsdp1 and ac.impl=wrapper: "
     "torch cannot load FSDP1 state through checkpoint wrappers; allowed: ac.impl=composable, utils or manual, or mesh.engine=fsdp2"),
    ("train.steps=-3", "error: train.steps=-3: allowed is >= 1"),
    ("train.batch_size=0", "error: train.batch_size=0: allowed is >= 1"),
    ("train.microbatches=3", "error: train.microbatches=3: must divide train.batch_size=4"),
    ("+model.dimm=3", "error: Key 'dimm' not in 'TransformerConfig'"),
    ("+fsdp.reshard=false", "error: Key 'reshard' not in 'FSDPConfig'"),
    ("mesh.engine=fsdp3", "error: mesh.engine=fsdp3: allowed are fsdp2, fsdp1, ddp"),
    ("device=tpu", "error: device=tpu: allowed are auto, cpu, cuda"),
    ("device=cuda", "error: device=cuda: no CUDA GPU is visible to this process; allowed here: auto, cpu"),
    ("model=no_such", "Could not find 'model/no_such'"),
    ("+experiment=no_such", "Could not find 'experiment/no_such'"),
    ("model.dim=abc", "Value 'abc' of type 'str' could not be converted to Integer"),
    ("train.overlap_steps=maybe", "Value 'maybe' is not a valid bool"),
    ("mesh.dp_shard=3 mesh.world_size=2", "error: mesh.world_size=2, but pp=1 x dp_replicate=1 x dp_shard=3 x tp=1 = 3"),
    ("mesh.dp_replicate=3 mesh.world_size=4", "error: mesh: pp=1 x dp_replicate=3 x tp=1 = 3 does not divide the world size 4, so mesh.dp_shard=-1 cannot fill it"),
    ("mesh.tp=0", "error: mesh.tp=0: allowed is >= 1"),
    ("model.n_heads=3", "error: model.n_heads=3: must divide model.dim=64"),
    ("fsdp.reshard_after_forward=3", "error: fsdp.reshard_after_forward=3: allowed are true, false, or an int >= 2 dividing mesh.dp_shard=2"),
    ("fsdp.reshard_after_forward=maybe", "error: fsdp.reshard_after_forward='maybe': allowed are true, false, or an int >= 2 dividing mesh.dp_shard=2"),
    ("fsdp.param_dtype=float16", "error: fsdp.param_dtype=float16: not supported on CPU; allowed here: float32, bfloat16, null"),
    ("fsdp.param_dtype=int8", "error: fsdp.param_dtype=int8: allowed are float32, bfloat16, float16, float64"),
    ("wrap=linear model.tie_embeddings=true", "error: wrap.policy=linear with model.tie_embeddings=true: the tied weight would sit in two FSDP units; allowed: wrap.policy=block|root|size"),
    ("mesh=ddp fsdp.cpu_offload=true", "error: fsdp.cpu_offload=true: applies to mesh.engine=fsdp2|fsdp1, not mesh.engine=ddp"),
    ("mesh.engine=fsdp1 fsdp.sharding_strategy=hybrid_shard", "error: fsdp.sharding_strategy=hybrid_shard: needs mesh.dp_replicate > 1 (e.g. mesh=hsdp), got mesh.dp_replicate=1"),
    ("mesh=hsdp mesh.engine=fsdp1 fsdp.reshard_after_forward=2", "error: fsdp.reshard_after_forward=2 with mesh.engine=fsdp1: allowed are true, false"),
    ("mesh=tp2d model.n_heads=8 mesh.tp=3 mesh.world_size=3", "error: mesh.tp=3: must divide model.n_heads=8 (each rank computes whole heads of model.dim=64 = 8 heads x 8)"),
    ("mesh=nd model.n_layers=3", "error: model.n_layers=3: must be a multiple of the pipeline stages, mesh.pp=2 x 1 stages per rank (mesh.pp_stages_per_rank) = 2"),
    ("mesh=nd model=mlp", "error: mesh.pp=2: model.name=mlp cannot be split into stages; allowed: mlp_stack, transformer"),
    ("mesh=nd mesh.pp_schedule=1f1b", "error: train.microbatches=1: mesh.pp_schedule=1f1b needs >= mesh.pp=2 microbatches"),
    ("mode=estimate mesh.world_size=4 mesh.pp=2 mesh.pp_schedule=interleaved_1f1b train.microbatches=2", "error: mesh.pp_schedule=interleaved_1f1b: mode=estimate cannot predict this; allowed with mesh.pp>1: gpipe, 1f1b (one stage per rank)"),
    ("fault.kill_rank=5 fault.at_step=1", "error: fault.kill_rank=5: must be a rank in 0..1"),
    ("fault.kill_rank=1", "error: fault.kill_rank and fault.at_step: set both or neither"),
    ("launch.numa_binding=numa", "error: launch.numa_binding=numa: allowed are node, socket, exclusive, core-complex"),
    ("launch.numa_binding=node", "error: launch.numa_binding=node: binds each rank to the CPUs near its GPU; this run's device is cpu: leave it null"),
    ("probes.memory.tracker=module probes.memory.tracker_step=30", "error: probes.memory.tracker_step=30: must be in 2..train.steps=20 (step 1 is the warm-up)"),
    ("optim.max_norm=0", "error: optim.max_norm=0.0: allowed is > 0"),
    ("optim.schedule=step", "error: optim.schedule=step: allowed are constant, linear, cosine"),
    ("optim.warmup_steps=-1", "error: optim.warmup_steps=-1: allowed is >= 0"),
    ("fault.kind=corrupt_grad fault.kill_rank=0 fault.at_step=1", "error: fault.module=None with fault.kind=corrupt_grad: fault.kind=corrupt_grad needs fault.module=PATH, and only it takes one"),
    ("fault.module=layers.0", "error: fault.module=layers.0 with fault.kind=kill: fault.kind=corrupt_grad needs fault.module=PATH, and only it takes one"),
    ("fault.kind=corrupt_grad fault.module=layers.9 fault.kill_rank=0 fault.at_step=1", "error: fault.module=layers.9: not a module with parameters of model.name=transformer; allowed: a module holding parameters, e.g. tok_embeddings, output"),
    ("model=mlp_stack model.freeze=nothing", "error: model.freeze=nothing: matches 0 of the 12 parameters of model.name=mlp_stack; allowed: a regex matching some but not all of layers.0.in_proj.weight, layers.0.in_proj.bias, layers.0.out_proj.weight, layers.0.out_proj.bias, ..."),
    ("model=mlp_stack model.freeze=layers", "error: model.freeze=layers: matches 12 of the 12 parameters of model.name=mlp_stack; allowed: a regex matching some but not all of layers.0.in_proj.weight, layers.0.in_proj.bias, layers.0.out_proj.weight, layers.0.out_proj.bias, ..."),
    ("model=mlp_stack model.freeze=in_proj probes.memory.tracker=module", "error: model.freeze=in_proj with probes.memory.tracker=module: torch's module tracker cannot follow frozen parameters; allowed: probes.memory.tracker=none (the per-phase probe works)"),
    ("mesh=ddp ac=full ac.impl=outer_wrapper", "error: ac.impl=outer_wrapper with mesh.engine=ddp: it wraps the blocks FSDP made units of, and DDP makes none; allowed: ac.impl=composable|utils|wrapper|manual, or mesh.engine=fsdp2|fsdp1"),
    ("+experiment=torch_fine_tune wrap=block", "error: model.freeze=in_proj with mesh.engine=fsdp1 and fsdp.use_orig_params=false: FSDP units layers.0, layers.1, layers.2 mix frozen and trainable parameters in one flat parameter; allowed: fsdp.use_orig_params=true, a wrap.policy giving frozen parameters their own units (e.g. linear), or a pattern freezing whole units"),
    ("checks=[parity_okay]", "error: checks=parity_okay: allowed are parity_ok, frozen_unchanged, phases_stable, optimizer_state_in_first_step, tracker_categories_sum_to_peak, tracker_accuracy, resumed, all_gather_per_step:N, reduce_scatter_per_step:N, all_reduce_per_step:N"),
    ("mode=estimate", "error: mesh.dp_shard=-1: mode=estimate needs the world size; set mesh.dp_shard=N or mesh.world_size=N"),
    ("mode=plan plan.gpus=12", "error: plan.gpus=12: must be at most or a multiple of plan.gpus_per_node=8 (whole nodes)"),
    ("mode=plan plan.device=a100", "error: plan.device=a100: allowed are auto, h100-80gb, h200"),
    ("mode=plan plan.global_batch_tokens=4Q", "error: plan.global_batch_tokens=4Q: an integer, or one with a K, M or G suffix (4M)"),
    ("mode=estimate mesh.engine=ddp mesh.world_size=8", "error: mesh.engine=ddp: mode=estimate cannot predict this; allowed: fsdp2 (FSDPMemTracker follows fully_shard only)"),
    ("optim.lr=-0.1", "error: optim.lr=-0.1: allowed is > 0"),
    ("train.seq_len=0", "error: train.seq_len=0: allowed is >= 1"),
    ("probes.parity.param_every=0", "error: probes.parity.param_every=0: allowed is >= 1"),
    ("optim.momentum=1.5", "error: optim.momentum=1.5: allowed is >= 0 and <= 1"),
    ("model=mlp model.layer_order=[0]", "Key 'layer_order' not in 'MLPConfig'"),  # each family has its own fields
    # A user's model (tests/own_models.py): model=custom and model=hf.
    ("model=custom model.build._target_=own_models.Nope", "error: model.build._target_=own_models.Nope: cannot be built (Error locating target 'own_models.Nope')"),
    (f"{GPT} model.blocks=layers", "error: model.blocks=layers: TinyGPT has no attribute 'layers' (its children: wte, wpe, blocks, head)"),
    (f"{GPT} model.blocks=wte", "error: model.blocks=wte: is a Embedding, not a non-empty list of modules (nn.ModuleList)"),
    # torch 2.13's embedding on the meta device refuses float ids; 2.11's (the GPUs') takes them and the logits' shape refuses them
    (f"{GPT} model.blocks=blocks model.inputs=features",
     ("error: model.inputs=features: the model rejects features of shape (2, 16) (model.features=[16]): RuntimeError: Expected tensor for argument #1 'indices'",
      "error: model.inputs=features: for features of shape (2, 16) (model.features=[16]) the model returns logits (2, 16, 64); expected (2, 16) (model.classes=16)")),
    (f"{GPT} model.blocks=blocks model.vocab_size=100",
     "error: model.inputs=tokens: for token ids < model.vocab_size=100 of shape (2, 32) the model returns logits (2, 32, 64); expected (2, 32, 100) (model.vocab_size=100)"),
    ("model=custom model.build._target_=own_models.Scaled +model.build.dim=4 model.blocks=blocks model.inputs=features model.features=[4]",
     "error: model.build._target_=own_models.Scaled: module (root) (Scaled) holds parameters but has no reset_parameters(), which the lab calls to initialise it from the seed"),
    (f"{GPT} model.blocks=blocks ac=full ac.impl=manual", "error: ac.impl=manual with model.name=custom: its forward does not call its blocks through fsdp_lab.models.blocks.call_block"),
    ("model=custom model.build._target_=own_models.TinyGPT +model.build.vocab=64 +model.build.dim=8192 +model.build.n_layer=24 model.blocks=blocks model.vocab_size=64",
     "error: probes.parity.enabled=true: the parity reference holds the whole model (12.89B parameters) on every rank, 384 GiB with"),
    ("model=hf", "error: model.model_type=null, model.config_path=null: set exactly one"),
    ("model=hf model.model_type=no_such", "error: model.model_type=no_such: transformers cannot build its config (Unrecognized model identifier: no_such)"),
    ("model=hf model.config_path=/no/such/dir", "error: model.config_path=/no/such/dir: no such file or directory"),
    ("model=hf model.model_type=gpt2 model.config.tie_word_embeddings=false mesh=tp2d mesh.world_size=2",
     "error: mesh.tp=2: model.model_type=gpt2 declares no tensor-parallel plan (base_model_tp_plan); allowed: mesh.tp=1"),
    ("model=hf model.model_type=llama model.config.attention_dropout=0.1 mesh=tp2d mesh.world_size=2",
     "error: mesh.tp=2: model.model_type=llama draws random numbers in its forward (attention_dropout=0.1), and a tensor-parallel shard "
     "draws other masks than its parity reference; set them to 0 (model.config.attention_dropout=0) or probes.parity.enabled=false"),
    ("model=hf model.model_type=gemma mesh=tp2d mesh.world_size=2",
     "error: model.config.tie_word_embeddings=true with mesh.tp=2: the embedding and the output would each distribute the shared weight"),
    ("sweep.objective=loss", "error: sweep.objective=loss: one of final_loss, perf/tokens_per_s, perf/step_time_s"),
    ("sweep.objective=perf/tokens_per_s probes.perf.enabled=false",
     "error: sweep.objective=perf/tokens_per_s: needs probes.perf.enabled=true"),
    ("sweep.objective=memory/peak_mib mode=estimate mesh.dp_shard=2",
     "error: sweep.objective=memory/peak_mib: only a training run returns a figure, not mode=estimate"),
    # Found by the generative test of the configuration space (tests/test_config_space.py): user code's
    # exceptions, names that resolve to nothing, faults that cannot fire, modes that crashed where train runs.
    (f"{LLAMA} model.config.hidden_size=30 model.config.num_attention_heads=4", "error: model.model_type=llama: transformers cannot build its config (ValueError: The hidden size (30) is not a multiple of the number of attention heads (4).)"),
    (f"{LLAMA} model.config.hidden_size=16 model.config.num_attention_heads=2 model.config.hidden_sise=16", "error: model.config.hidden_sise=16: LlamaConfig has no field hidden_sise, so transformers would ignore it; allowed: its fields, e.g. hidden_size, hidden_act"),
    ("model=custom model.build._target_=torch.nn.Linear +model.build.in_features=4 +model.build.out_features=4 +model.build.nope=1", "error: model.build._target_=torch.nn.Linear: cannot be built (TypeError: Linear.__init__() got an unexpected keyword argument 'nope')"),
    ("wrap.policy=classes wrap.classes=[NoSuchBlock]", "error: wrap.classes=[NoSuchBlock]: NoSuchBlock: no module of model.name=transformer is of that class; allowed: class names of its modules: Attention, Embedding, FeedForward, Linear, ModuleList, RMSNorm, TransformerBlock"),
    ("wrap.policy=classes", "error: wrap.classes=[]: names no class; allowed: class names of its modules: Attention, Embedding, FeedForward, Linear, ModuleList, RMSNorm, TransformerBlock"),
    ("wrap.classes=[TransformerBlock]", "error: wrap.classes=[TransformerBlock] with wrap.policy=block: only wrap.policy=classes reads it; allowed: wrap.policy=classes, or wrap.classes=[]"),
    ("fault.kind=corrupt_grad fault.module=layers.1", "error: fault.kind=corrupt_grad: no fault.kill_rank and fault.at_step, so it never fires; allowed: set both (which rank, after how many steps), or leave fault.* unset"),
    ("fault.kind=raise", "error: fault.kind=raise: no fault.kill_rank and fault.at_step, so it never fires; allowed: set both (which rank, after how many steps), or leave fault.* unset"),
    ("fault.kill_rank=0 fault.at_step=20", "error: fault.at_step=20: the run ends after train.steps=20, so the fault never fires; allowed: 0..19 (the steps done before it strikes)"),
    ("fault.kill_rank=0 fault.at_step=2 fault.phase=save", "error: fault.phase=save with checkpoint.kind=none: nothing is saved, so the fault never fires; allowed: checkpoint=dcp"),
    ("fault.kill_rank=0 fault.at_step=3 fault.phase=save checkpoint=dcp checkpoint.interval=2", "error: fault.at_step=3 with fault.phase=save: no checkpoint is saved after step 3 (checkpoint.interval=2, train.steps=20); allowed: a multiple of 2 up to 20, or 20"),
    ("mode=estimate mesh.world_size=2 fault.kill_rank=0 fault.at_step=1", "error: fault.kill_rank=0 with mode=estimate: nothing trains, so the fault never fires; allowed: mode=train"),
    ("mesh=nd fault.kind=corrupt_grad fault.module=layers.0 fault.kill_rank=7 fault.at_step=1 mesh.world_size=8", "error: fault.module=layers.0: not on fault.kill_rank=7, whose pipeline stage (mesh.pp rank 1) holds layers, layers.1, layers.1.attention_norm, layers.1.attention, layers.1.attention.wq, layers.1.attention.wk, ... (15 in all); allowed: a module of that stage, or another fault.kill_rank"),
    ("model=vit mode=estimate mesh.world_size=2", "error: wrap.policy=block with mode=estimate: it makes PatchEncoder a unit, called through forward_features, which torch's FSDPMemTracker cannot follow; allowed: wrap.policy=root|linear|size"),
    ("mesh=nd mode=estimate mesh.world_size=8", "error: mesh.tp=2 with mesh.pp=2 and mode=estimate: the estimate cannot trace tensor parallelism inside pipeline stages yet; allowed: mesh.tp=1 or mesh.pp=1"),
    ("model=hf model.model_type=qwen2 model.config.hidden_size=16 model.config.num_attention_heads=2 model.config.num_hidden_layers=2 model.config.intermediate_size=32 model.config.vocab_size=256",
     "error: model.config.num_key_value_heads=32 (set, or Qwen2Config's default): must divide model.config.num_attention_heads=2; allowed: a divisor of 2"),
    ("mesh=ddp mode=plan", "error: mesh.engine=ddp with mode=plan: the planner lays out FSDP2 meshes; allowed: mesh.engine=fsdp2"),
    ("model=unused_input mode=plan", "error: model.name=unused_input with mode=plan: the blocks of UnusedInput are not one nn.ModuleList: cannot cut them to 1"),
]


# One of each source of refusal: the schema (unknown key, choice, limit), Hydra (type, group option), the
# mesh, the checks of validate.py, the device, a model family's build: each through the CLI's entry point
# in this process, and two of them also through a real process (exit code, output, run dir as a user sees them).
THROUGH_THE_CLI = {"optim.lr=-0.1", "+model.dimm=3", "mesh.engine=fsdp3", "model.dim=abc", "model=no_such", "train.microbatches=3",
                   "mesh.dp_shard=3 mesh.world_size=2", "device=cuda", "model=hf model.model_type=no_such",
                   f"{LLAMA} model.config.hidden_size=30 model.config.num_attention_heads=4", "wrap.policy=classes wrap.classes=[NoSuchBlock]",
                   "fault.kind=corrupt_grad fault.module=layers.1"}
IN_A_PROCESS = ("train.microbatches=3", "model=no_such")


def refusal(prepared, overrides: str) -> str:
    """The message a composed-and-checked config is refused with, as the CLI prints it."""
    try:
        prepared(*overrides.split())
    except Exception as e:  # Hydra's own errors carry the detail in their cause
        return f"error: {e}" + (f" {e.__cause__}" if e.__cause__ else "")
    raise AssertionError(f"{overrides} was accepted")


@pytest.mark.parametrize("overrides,message", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_bad_input_is_refused_with_its_message(prepared, overrides, message):
    """`message`, or one of a tuple of them where torch versions refuse an input at different checks."""
    refused = refusal(prepared, overrides)
    assert any(m.removeprefix("error: ") in refused for m in (message if isinstance(message, tuple) else (message,))), refused


def assert_refused_before_any_rank_starts(result, message: str, run_dir) -> None:
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    if message.startswith("error: "):
        assert result.returncode == 2 and result.error_lines == [message]
    assert "[rank" not in result.stdout + result.stderr, "no rank may start"
    assert not run_dir.exists(), "a refused run leaves no run dir"


@pytest.mark.parametrize("overrides,message", [c for c in CATALOGUE if c[0] in THROUGH_THE_CLI], ids=sorted(THROUGH_THE_CLI, key=[c[0] for c in CATALOGUE].index))
def test_bad_input_is_refused_by_the_cli_before_any_rank_starts(tmp_path, overrides, message):
    result = run_lab_here(*overrides.split(), "logger=none", run_dir=tmp_path / "run", as_rank=False)
    assert_refused_before_any_rank_starts(result, message, tmp_path / "run")


@pytest.mark.slow
@pytest.mark.parametrize("overrides", IN_A_PROCESS)
def test_a_real_process_exits_with_the_refusal(tmp_path, overrides):
    message = dict(CATALOGUE)[overrides]
    result = run_lab(*overrides.split(), "logger=none", run_dir=tmp_path / "run", timeout=60)
    assert_refused_before_any_rank_starts(result, message, tmp_path / "run")


# The model's fields are declared by each model family (checked family by family below).
NOT_WALKED = {"model"}
NUMERIC = ("int", "float", "Optional[int]", "Optional[float]")


def schema_fields(node=RunConfig(), path: str = "") -> list[tuple[str, str, dict]]:
    """(key, type, limits) of every leaf field of the schema."""
    found = []
    for f in fields(node):
        value = getattr(node, f.name)
        if is_dataclass(value):
            if f.name not in NOT_WALKED:
                found += schema_fields(value, f"{path}{f.name}.")
        else:
            found.append((f"{path}{f.name}", f.type, f.metadata.get("limits")))
    return found


def out_of_range(field_type: str, limits: dict) -> list:
    """A value just past each limit: below ge, at gt, above le."""
    cast = float if "float" in field_type else int
    step = {"ge": -1, "gt": 0, "le": 1}
    return [cast(limit + step[name]) for name, limit in limits.items()]


BOUNDED = [(key, field_type, limits) for key, field_type, limits in schema_fields() if limits]
LIMIT_CASES = [(key, value, limits) for key, field_type, limits in BOUNDED for value in out_of_range(field_type, limits)]


def test_every_numeric_field_declares_its_limits():
    families = [family() for family in ModelConfig.__subclasses__()]
    assert len(families) >= 6
    model_fields = [(f"model.{key}", t, limits) for family in families for key, t, limits in schema_fields(family)]
    assert [key for key, field_type, limits in schema_fields() + model_fields if field_type in NUMERIC and not limits] == []
    assert len(BOUNDED) >= 30


@pytest.mark.parametrize("key,value,limits", LIMIT_CASES, ids=[f"{k}={v}" for k, v, _ in LIMIT_CASES])
def test_a_value_outside_a_declared_limit_is_refused_naming_the_limit(prepared, key, value, limits):
    rule = " and ".join({"ge": f">= {x}", "gt": f"> {x}", "le": f"<= {x}"}[name] for name, x in limits.items())
    assert refusal(prepared, f"{key}={value}") == f"error: {key}={value}: allowed is {rule}"


def test_resume_from_a_checkpoint_of_another_model_is_refused_before_any_rank_starts(tmp_path):
    saved = run_lab_here("checkpoint=dcp", "train.steps=2", "logger=none", "probes.memory.enabled=false", run_dir=tmp_path / "saved")
    assert saved.returncode == 0, saved.stderr[-2000:]
    checkpoint = tmp_path / "saved" / "checkpoints" / "step_00000002"
    result = run_lab_here(f"checkpoint.resume={checkpoint}", "model.dim=32", "logger=none", run_dir=tmp_path / "run", as_rank=False)
    assert result.returncode == 2
    (line,) = result.error_lines
    assert line.startswith(f"error: checkpoint.resume={checkpoint}: saved for another model: (saved, now) = {{'dim': (64, 32)")
    assert "[rank" not in result.stdout + result.stderr and not (tmp_path / "run").exists()
