"""The ``raftmq`` data source against a cluster that requires API tokens and serves HTTPS only:
``token`` and ``caFile`` reach the planner and the executors, sealed segments and the unsealed tail
are both read through them, and a read without a token fails with the node's 401."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import Cluster, wait_until
from tests.integration.tls_certs import CertAuthority

from .conftest import require_spark

require_spark()

pytestmark = pytest.mark.timeout(300)

ADMIN = "spark-admin-token-4Rt7Yu1Io9Pa"
READER = "spark-reader-token-2Ws5Xd8Cf3Vg"
TOML = f"""
[segments]
max_messages = 40
check_ms = 200

[[security.tokens]]
name = "admin"
sha256 = "{hashlib.sha256(ADMIN.encode()).hexdigest()}"
admin = ["*"]
produce = ["*"]
consume = ["*"]

[[security.tokens]]
name = "reader"
token = "{READER}"
consume = ["sp.*"]
"""


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Path]]:
    tmp: Path = tmp_path_factory.mktemp("spark-secure")
    ca = CertAuthority(tmp)
    cert = ca.issue("cluster")
    tls = f'[tls]\ncert_file = "{cert.cert}"\nkey_file = "{cert.key}"\nca_file = "{ca.cert_path}"\n'
    with Cluster(tmp, nodes=3, queue_groups=1, extra_toml=tls + TOML, scheme="https") as c:
        c.session.verify = str(ca.cert_path)
        c.session.trust_env = False
        c.session.headers["Authorization"] = f"Bearer {ADMIN}"
        c.start()
        c.wait_ready()
        yield c, ca.cert_path


def _read(spark: Any, c: Cluster, **options: str) -> Any:
    r = spark.read.format("raftmq").option("brokers", ",".join(c.url(n) for n in c.nodes))
    r = r.option("topic", "sp.secure")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_a_token_and_ca_file_read_segments_and_the_tail_over_https(
    spark: Any, secure: tuple[Cluster, Path]
) -> None:
    c, ca = secure
    assert c.url("n1").startswith("https://")
    c.create_topic("sp.secure", queues=2)
    msgs = [{"value": f"v{i}", "queue": i % 2} for i in range(130)]  # 65 a queue: [0,40) sealed
    assert c.produce("sp.secure", msgs).status_code == 200

    def sealed() -> bool:
        queues = c.get("/v1/topics/sp.secure/segments").json()["queues"]
        return all(q["sealed_end"] == 40 for q in queues)

    wait_until(sealed, 30, what="segments sealed")
    rows = _read(spark, c, token=READER, caFile=str(ca)).select("partition", "offset", "value").collect()
    got = sorted((r["partition"], r["offset"], bytes(r["value"]).decode()) for r in rows)
    assert got == sorted((i % 2, i // 2, f"v{i}") for i in range(130))


def test_without_a_token_the_read_fails_with_the_nodes_401(spark: Any, secure: tuple[Cluster, Path]) -> None:
    c, ca = secure
    with pytest.raises(Exception, match="401") as info:
        _read(spark, c, caFile=str(ca)).count()
    assert READER not in str(info.value) and ADMIN not in str(info.value)


def test_a_missing_ca_file_is_a_clear_option_error(spark: Any, secure: tuple[Cluster, Path]) -> None:
    c, _ = secure
    with pytest.raises(Exception, match="caFile"):
        _read(spark, c, token=READER, caFile="/nonexistent/ca.pem").count()
