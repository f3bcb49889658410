"""``raftmq sqs-credentials``: the calling token's AWS credentials for the SQS API (docs/sqs.md)."""

from __future__ import annotations

import click

from raftmq.cluster.cli.admin_http import AdminHttp
from raftmq.cluster.cli.common import _print_json, admin_command, json_option

__all__ = ["sqs_credentials"]


@click.command("sqs-credentials")
@json_option
@admin_command
def sqs_credentials(admin: AdminHttp, as_json: bool) -> None:
    """Print the token's AWS credentials for the SQS API, as environment variables for boto3 and the
    AWS CLI (access key id: the token's name; the secret is derived from the cluster secret)."""
    data = admin.get("/v1/sqs/credentials")
    if as_json:
        _print_json(data)
        return
    if not data["signature_checked"]:
        click.echo("# this cluster has no API tokens: the SQS API takes any credentials", err=True)
        click.echo(f"AWS_DEFAULT_REGION={data['region']}")
        return
    click.echo(f"AWS_ACCESS_KEY_ID={data['access_key_id']}")
    click.echo(f"AWS_SECRET_ACCESS_KEY={data['secret_access_key']}")
    click.echo(f"AWS_DEFAULT_REGION={data['region']}")
