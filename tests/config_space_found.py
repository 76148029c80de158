"""What the generative test of the configuration space found on main, kept as explicit examples
(each is tried first, on every run of the property): FOUND are refused in one line now, FOUND_TRAINING
train now."""

from __future__ import annotations

from hypothesis import example

LLAMA = ["model=hf", "model.model_type=llama", "model.config.num_hidden_layers=2", "model.config.intermediate_size=32",
         "model.config.vocab_size=256"]
FOUND = [
    # mode=estimate on a unit entered through forward_features: FSDPMemTracker's KeyError.
    ["logger=none", "model=vit", "model.image_size=8", "mode=estimate", "mesh.world_size=1"],
    # mode=estimate with tp inside pipeline stages: "Could not resolve the process group registered under the name 17".
    ["logger=none", "model=transformer", "model.dim=16", "model.n_layers=2", "model.ffn_dim=32", "optim=adamw", "mesh=nd",
     "mode=estimate", "mesh.world_size=8"],
    # mode=plan on a family without model.n_layers: AttributeError in the planner.
    ["logger=none", "model=mlp", "mode=plan", "plan.gpus=1", "plan.gpus_per_node=1", "plan.top=1"],
    # mode=plan with a block order: IndexError, or FSDP's AttributeError, in the planner's shallower traces.
    ["logger=none", "model=transformer", "model.dim=16", "model.n_layers=2", "model.ffn_dim=32", "mode=plan", "plan.gpus=1",
     "plan.gpus_per_node=1", "plan.top=1", "model.layer_order=[0,0,1]"],
    # ... and one naming a block the model lacks: IndexError counting its FLOPs, before the order was refused.
    ["logger=none", "model=transformer", "model.dim=16", "model.n_layers=2", "model.ffn_dim=32", "mode=plan", "plan.gpus=1",
     "plan.gpus_per_node=1", "plan.top=1", "model.layer_order=[5]"],
    # transformers' own validation of a config: StrictDataclassClassValidationError through Hydra.
    ["logger=none", *LLAMA, "model.config.hidden_size=30", "model.config.num_attention_heads=4"],
    # a misspelt transformers config field: the default model built, the key ignored.
    ["logger=none", *LLAMA, "model.config.hidden_size=16", "model.config.num_attention_heads=2", "model.config.hidden_sise=16"],
    # a class that names nothing: the run trained with nothing wrapped as asked.
    ["logger=none", "model=transformer", "wrap.policy=classes", "wrap.classes=[NoSuchBlock]"],
    # a fault that cannot fire: no step, or one past train.steps.
    ["logger=none", "model=transformer", "fault.kind=corrupt_grad", "fault.module=layers.1"],
    ["logger=none", "model=transformer", "fault.kill_rank=0", "fault.at_step=20"],
    # a block run alone whose parameters the root unit holds (wrap=root): DTensor's "mixed torch.Tensor and DTensor" on rank 0.
    ["logger=none", "model=mlp_stack", "wrap=root", "train.standalone_layer=0"],
]

FOUND_TRAINING = [
    # a layer order that skips blocks: the DDP parity reference waited for their gradients (RuntimeError on rank 0).
    ["logger=none", "model=mlp_stack", "mesh.pp=1", "model.layer_order=[0]"],
    # batch norms under bf16 parameters: "expected scalar type BFloat16 but found Float" on rank 0 (seed 35).
    ["logger=none", "model=convnet", "model.dim=4", "model.image_size=8", "fsdp.param_dtype=bfloat16", "train.steps=2"],
]


def with_found(test, found=FOUND):
    """`test` with every found example as an explicit @example(args=...)."""
    for args in reversed(found):
        test = example(args=args)(test)
    return test
