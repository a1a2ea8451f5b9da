"""Benchmarks: fsbus side by side with its peers, on the same machine, in one run.

Run ``python -m bench.run --help`` (or ``make bench`` / ``make bench-quick``).
"""
