"""docs/api-reference.md is the OpenAPI spec rendered: it must match what the nodes serve."""

from __future__ import annotations

from pathlib import Path

from raftmq.cluster.api.openapi.markdown import render
from raftmq.cluster.api.openapi.spec import openapi_spec

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "api-reference.md"


def test_the_committed_reference_is_the_rendered_spec() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == render(), (
        "docs/api-reference.md is stale: "
        "python -m raftmq.cluster.api.openapi.markdown > docs/api-reference.md"
    )


def test_every_operation_and_schema_of_the_spec_is_in_the_reference() -> None:
    spec, text = openapi_spec(), render()
    for path, item in spec["paths"].items():
        for method in item:
            assert f"### `{method.upper()} {path}`" in text
    for name in spec["components"]["schemas"]:
        assert f"\n### {name}\n" in text
    assert "`stale_sequence`" in text and "| 401 | `unauthorized` |" in text


def test_nested_fields_are_listed_by_their_path() -> None:
    text = render()
    start = text.index("### ProduceRequest")
    section = text[start : text.index("\n### ", start + 1)]
    assert "`messages[]`:" in section and "| `value_b64` | string |" in section
