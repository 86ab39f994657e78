"""Benchmark commands: ``python -m benchmarks.<build|read|append|orchestration|compare> [--smoke]``."""
