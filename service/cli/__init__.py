"""The `trident` command: its arithmetic chosen before NumPy loads, then the command
(service/cli/commands.py)."""

from __future__ import annotations

from collections.abc import Sequence

from service.arithmetic import pin_arithmetic


def main(argv: Sequence[str] | None = None) -> int:
    pin_arithmetic()
    from service.cli.commands import main as run_command

    return run_command(argv)
