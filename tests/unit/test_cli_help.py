"""``-h`` is ``--help`` on every command of the real ``raftmq`` binary (issue 15: "No such option")."""

from __future__ import annotations

import subprocess
import sys

import click
from click.testing import CliRunner

from raftmq.cluster.cli.main import main


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            out += _commands(command, (*prefix, name))
        elif command is not None:
            out.append((*prefix, name))
    return out


def test_dash_h_prints_the_help_of_every_command() -> None:
    commands = _commands(main)
    assert ("produce",) in commands and ("cluster", "add-node") in commands and ("dlq", "list") in commands
    runner = CliRunner()
    for command in commands:
        long = runner.invoke(main, [*command, "--help"], prog_name="raftmq")
        short = runner.invoke(main, [*command, "-h"], prog_name="raftmq")
        assert short.exit_code == 0, (command, short.output)
        assert short.output == long.output and short.output.startswith("Usage: raftmq"), command


def test_dash_h_in_the_real_binary() -> None:
    for command in ((), ("produce",), ("cluster", "add-node")):
        done = subprocess.run(
            [sys.executable, "-m", "raftmq.cluster.cli.main", *command, "-h"], capture_output=True, text=True
        )
        assert done.returncode == 0 and done.stdout.startswith("Usage: "), (command, done.stderr)
