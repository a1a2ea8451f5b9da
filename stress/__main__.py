"""``python -m stress <name|all> [--size small|large]``: run scenarios, print summaries."""

from __future__ import annotations

import argparse
import importlib
import sys

from ._common import add_options, options

SCENARIOS = ("fanout", "workqueue", "chaos", "mixed", "queues")


def main(argv: list[str] | None = None) -> int:
    """Run the named scenario (or all of them); exit 1 if any guarantee broke."""
    parser = argparse.ArgumentParser(prog="python -m stress", description=__doc__)
    parser.add_argument("name", choices=(*SCENARIOS, "all"), help="scenario to run")
    add_options(parser)
    args = parser.parse_args(argv)
    names = SCENARIOS if args.name == "all" else (args.name,)
    failed = 0
    for name in names:
        module = importlib.import_module(f"stress.{name}")
        summary = module.run(args.size, **options(args))
        print(summary.line(), flush=True)
        for v in summary.violations[:20]:
            print(f"  violation: {v}", file=sys.stderr)
        failed += not summary.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
