"""Where a run's numbers go: plain files in the run dir (always) and W&B (logger=wandb)."""
