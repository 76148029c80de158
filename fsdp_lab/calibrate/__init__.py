"""Fitting the plan's device tables from measurements on the device (benchmarks/calibrate_device.py is
the command line): the host's cost of issuing a step (host.py), a block's elementwise time
(elementwise.py), and fitting a table again from its stored measurements (refit.py). fsdp_lab/plan/
only reads the tables."""
