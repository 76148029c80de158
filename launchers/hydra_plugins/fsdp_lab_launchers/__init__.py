"""fsdp_lab launcher plugins for Hydra: `hydra/launcher=torchrun` (local, packed) and `hydra/launcher=slurm`."""
