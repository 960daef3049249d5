"""Benchmarks. Every ``python -m bench.<name>`` runs models on the CPU as the services do: the
OpenMP wait the launcher gives the services is set here, before torch loads (shared/omp_wait.py)."""

from shared.omp_wait import apply_defaults

apply_defaults()
