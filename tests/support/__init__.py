"""Helpers that several test modules share (graph runners, NumPy references, fixture models,
the MPI launcher, the multi-backend op table). No tests here; no test module imports another."""
