"""``python -m fsbus``: the command line."""

from __future__ import annotations

try:
    from ._cli.main import main
except KeyboardInterrupt:  # Ctrl-C while starting up: nothing to clean, no traceback
    raise SystemExit(130) from None

raise SystemExit(main())
