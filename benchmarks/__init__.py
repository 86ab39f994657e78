"""Benchmark commands: ``python -m benchmarks.<name> [--smoke]`` (benchmarks/README.md)."""
