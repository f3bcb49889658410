"""The ``raftmq`` command line: run nodes and a local cluster, inspect and administer it."""

from __future__ import annotations

import click

from raftmq.cluster.cli import cluster as _cli_cluster
from raftmq.cluster.cli.backup import backup_command, restore_command
from raftmq.cluster.cli.common import admin_command, json_option
from raftmq.cluster.cli.messages import consume, dlq, produce, receive, subscription
from raftmq.cluster.cli.repair import repair_journal_command
from raftmq.cluster.cli.serve import dev, serve
from raftmq.cluster.cli.sqs import sqs_credentials
from raftmq.cluster.cli.topics import status, topic

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})  # -h on every command
@click.version_option("0.1.0", prog_name="raftmq")
def main() -> None:
    """raftmq: a highly available message broker cluster."""


# serve/dev in cli/serve.py, status/topic in cli/topics.py, produce/consume/receive/dlq in
# cli/messages.py (and subscription); the shared options in cli/common.py.
for _command in (serve, dev, status, topic, produce, consume, receive, dlq, subscription):
    main.add_command(_command)


main.add_command(backup_command)  # cluster/cli/backup.py
main.add_command(restore_command)
main.add_command(repair_journal_command)  # cluster/cli/repair.py
main.add_command(sqs_credentials)  # cluster/cli/sqs.py
_cli_cluster.register(main, admin_command, json_option)  # raftmq cluster ... (cluster/cli/cluster.py)

if __name__ == "__main__":
    main()
