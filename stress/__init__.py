"""Stress scenarios for fsbus: real processes, counted messages, non-zero exit on loss.

Run one with ``python -m stress <name> [--size small|large]`` or ``python -m stress.<name>``;
``python -m stress all`` runs every scenario. Each prints one summary line (sent, delivered,
duplicates, lost, rate) and exits 1 when a guarantee was broken. Scenarios use only the
public :mod:`fsbus` API.
"""
