"""docs/api-reference.md, written from the OpenAPI spec so that the reference cannot drift from
what the nodes serve at ``GET /openapi.json``.

    python -m raftmq.cluster.api.openapi.markdown > docs/api-reference.md

``tests/unit/test_api_reference.py`` fails when the committed file differs from this output.
"""

from __future__ import annotations

import sys
from typing import Any

import orjson

from raftmq.cluster.api.openapi.spec import openapi_spec

__all__ = ["render"]

_METHODS = ("get", "put", "post", "delete", "patch")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type(schema: dict[str, Any]) -> str:
    """A short type for a table cell: ``string``, ``integer (0..100)``, ``Topic``, ``array of X``."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "properties" in schema:
        return "object (fields below)"
    if "enum" in schema:
        return "one of " + ", ".join(f"`{v}`" for v in schema["enum"])
    if "type" not in schema and ("oneOf" in schema or "anyOf" in schema):
        return " or ".join(_type(s) for s in schema.get("oneOf", schema.get("anyOf", [])))
    kind = schema.get("type", "any")
    text = " or ".join(kind) if isinstance(kind, list) else str(kind)
    if "items" in schema:
        text += " of " + _type(schema["items"])
    bounds = [str(schema[k]) if k in schema else "" for k in ("minimum", "maximum")]
    if any(bounds):
        text += f" ({bounds[0]}..{bounds[1]})"
    return text


def _fields(schema: dict[str, Any], prefix: str = "") -> list[str]:
    """A table of ``schema``'s fields, then one for each field that is an object (or an array of
    objects) with fields of its own, named by its path (``messages[]``)."""
    props = schema.get("properties")
    if not props:
        return [f"{_type(schema)}. {schema.get('description', '')}".strip(), ""]
    required = set(schema.get("required", ()))
    lines = ["| field | type | required | description |", "| --- | --- | --- | --- |"]
    nested: list[tuple[str, dict[str, Any]]] = []
    for name, prop in props.items():
        desc = _cell(prop.get("description", ""))
        lines.append(f"| `{name}` | {_cell(_type(prop))} | {'yes' if name in required else ''} | {desc} |")
        if "properties" in prop:
            nested.append((f"{prefix}{name}", prop))
        elif "properties" in prop.get("items", {}):
            nested.append((f"{prefix}{name}[]", prop["items"]))
    lines.append("")
    for path, sub in nested:
        lines += [f"`{path}`:", "", *_fields(sub, path + ".")]
    return lines


def _operation(path: str, method: str, op: dict[str, Any]) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", "", op.get("summary", ""), ""]
    if op.get("security"):
        lines += ["Needs a token once the cluster requires tokens (docs/security.md).", ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required | description |", "| --- | --- | --- | --- | --- |"]
        for p in params:
            req = "yes" if p.get("required") else ""
            desc = _cell(p.get("description", ""))
            lines.append(f"| `{p['name']}` | {p['in']} | {_cell(_type(p['schema']))} | {req} | {desc} |")
        lines.append("")
    body = op.get("requestBody")
    if body:
        for media, content in body["content"].items():
            lines += [f"Request body ({media}): {_type(content['schema'])}", ""]
    lines += ["| status | answer |", "| --- | --- |"]
    for status, answer in op["responses"].items():
        lines.append(f"| {status} | {_cell(answer.get('description', ''))} |")
    return [*lines, ""]


def render(spec: dict[str, Any] | None = None) -> str:
    """The reference as Markdown."""
    spec = spec or openapi_spec()
    lines = [
        "# API reference",
        "",
        "Generated from the OpenAPI spec (`GET /openapi.json` on any node) by",
        "`python -m raftmq.cluster.api.openapi.markdown`; do not edit by hand. The guide to the API, with",
        "examples and the error model, is [api.md](api.md).",
        "",
        _cell(spec["info"].get("description", "")),
        "",
        "## Operations",
        "",
    ]
    for path, item in spec["paths"].items():
        for method in _METHODS:
            if method in item:
                lines += _operation(path, method, item[method])
    lines += ["## Schemas", ""]
    for name, schema in spec["components"]["schemas"].items():
        lines += [f"### {name}", ""]
        if schema.get("description"):
            lines += [_cell(schema["description"]), ""]
        lines += _fields(schema)
    codes = spec["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"]
    lines += ["## Error codes", "", ", ".join(f"`{c}`" for c in codes), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> None:
    if sys.argv[1:] == ["--json"]:
        sys.stdout.buffer.write(orjson.dumps(openapi_spec(), option=orjson.OPT_INDENT_2))
        return
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
