"""The ``raftmq`` command line: run nodes and a local cluster, inspect and administer it."""

from __future__ import annotations

import click

from . import cli_cluster as _cli_cluster
from .backup import backup_command, restore_command
from .cli_common import admin_command, json_option
from .cli_messages import consume, dlq, produce, receive
from .cli_repair import repair_journal_command
from .cli_serve import dev, serve
from .cli_topics import status, topic

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})  # -h on every command
@click.version_option("0.1.0", prog_name="raftmq")
def main() -> None:
    """raftmq: a highly available message broker cluster."""


# serve/dev in cli_serve.py, status/topic in cli_topics.py, produce/consume/receive/dlq in
# cli_messages.py; the shared options in cli_common.py.
for _command in (serve, dev, status, topic, produce, consume, receive, dlq):
    main.add_command(_command)


main.add_command(backup_command)  # cluster/backup.py
main.add_command(restore_command)
main.add_command(repair_journal_command)  # cluster/cli_repair.py
_cli_cluster.register(main, admin_command, json_option)  # raftmq cluster ... (cluster/cli_cluster.py)

if __name__ == "__main__":
    main()
