"""fsdp_lab: a Hydra-configured laboratory for sharded training in PyTorch."""
