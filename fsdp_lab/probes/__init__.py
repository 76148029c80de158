"""Probes measure a run without changing what it computes: parity against a reference, memory per
phase, throughput."""
