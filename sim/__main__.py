"""Entry point: `python -m sim [memory|sweep|plan] ...`; without a subcommand, run a trace."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    if command == "memory":
        from sim.memory_cli import main as memory_main

        return memory_main(argv[1:])
    if command in ("sweep", "plan"):
        from sim.planning import cli as planning_cli

        return planning_cli.main(argv)
    from sim.cli import main as run_main

    return run_main(argv)


if __name__ == "__main__":
    sys.exit(main())
