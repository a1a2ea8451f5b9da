"""The ``fsbus`` command: one module per group of subcommands.

An edge: it reaches the library only through the public ``fsbus`` names (and
``fsbus.ui`` for the dashboard), never through another private package.
"""

from .main import main

__all__ = ("main",)
