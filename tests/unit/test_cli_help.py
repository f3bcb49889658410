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


def test_every_option_of_every_command_says_what_it_does() -> None:
    """``raftmq dlq list -h`` showed ``--max`` and ``raftmq serve -h`` ``--log-level`` with no word."""
    undocumented = []
    for path in _commands(main):
        command: click.Command = main
        for name in path:
            assert isinstance(command, click.Group)
            found = command.get_command(click.Context(command), name)
            assert found is not None
            command = found
        undocumented += [(path, p.opts) for p in command.params if isinstance(p, click.Option) and not p.help]
    assert undocumented == []


def test_dlq_list_refuses_more_than_the_api_hands_out_before_asking_a_node() -> None:
    """The API's dead-letter list takes max up to 10,000; a larger --max was sent and refused by a node."""
    command = ["dlq", "list", "orders", "--group", "g", "--max", "10001", "--url", "127.0.0.1:9"]
    done = subprocess.run(
        [sys.executable, "-m", "raftmq.cluster.cli.main", *command],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert "--max" in done.stderr and "10000" in done.stderr and "no raftmq node" not in done.stderr
