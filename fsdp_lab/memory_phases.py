"""The phases of a training step that memory is recorded at (the `memory/<phase>_mib` metric keys),
and the unit they are reported in: shared by the memory probe, the sinks, the checks and the report."""

PHASES = ("start", "after_fwd", "after_loss", "after_bwd", "after_step", "done")
MIB = 2**20
