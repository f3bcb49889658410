"""Field validators shared by the command decoders (``cluster/commands/__init__.py``): strict types and
ranges, each error naming its field.
"""

from __future__ import annotations

from typing import Any

from raftmq.cluster.base import errors
from raftmq.cluster.commands.shapes import (
    MAX_DURATION_MS,
    MAX_NAME_BYTES,
    MAX_RECEIVE,
    MAX_TIME_MS,
    BadCommand,
)
from raftmq.storage.keys import MAX_U32, MAX_U64


def _bad(message: str) -> BadCommand:
    return BadCommand(errors.BAD_REQUEST, message)


def _fields(obj: dict[str, Any], where: str, allowed: set[str]) -> None:
    unknown = obj.keys() - allowed
    if unknown:
        raise _bad(f"{where}: unknown fields {sorted(unknown)}")


def _uint(obj: dict[str, Any], name: str, max_value: int, where: str) -> int:
    value = obj.get(name)
    # type() rather than isinstance(): a JSON true must not pass as 1.
    if type(value) is not int or not 0 <= value <= max_value:
        raise _bad(f"{where}{name}: expected an integer in [0, {max_value}], got {value!r}")
    return value


def _optional_uint(obj: dict[str, Any], name: str, where: str) -> int | None:
    if obj.get(name) is None:
        return None
    return _uint(obj, name, MAX_U64, where)


def _name(obj: dict[str, Any], name: str, where: str) -> str:
    value = obj.get(name)
    if type(value) is not str or not 1 <= len(value.encode("utf-8")) <= MAX_NAME_BYTES:
        raise _bad(f"{where}{name}: expected a string of 1..{MAX_NAME_BYTES} UTF-8 bytes")
    return value


def _list(obj: dict[str, Any], name: str, where: str, *, allow_empty: bool = False) -> list[Any]:
    value = obj.get(name)
    if type(value) is not list or (not value and not allow_empty):
        raise _bad(f"{where}{name}: expected a {'' if allow_empty else 'non-empty '}list")
    return value


def _optional_time(obj: dict[str, Any], name: str, where: str) -> int | None:
    return None if obj.get(name) is None else _uint(obj, name, MAX_TIME_MS, where)


def _optional_duration(obj: dict[str, Any], name: str, where: str) -> int | None:
    return None if obj.get(name) is None else _uint(obj, name, MAX_DURATION_MS, where)


def _positive(obj: dict[str, Any], name: str, max_value: int) -> int:
    value = _uint(obj, name, max_value, "")
    if value < 1:
        raise _bad(f"{name}: expected an integer in [1, {max_value}], got 0")
    return value


def _queue_list(obj: dict[str, Any], name: str) -> list[int]:
    raw = _list(obj, name, "")
    if len(raw) > MAX_RECEIVE:
        raise _bad(f"{name}: more than {MAX_RECEIVE} queues")
    queues = [_uint({"q": q}, "q", MAX_U32, f"{name}[{i}].") for i, q in enumerate(raw)]
    if len(set(queues)) != len(queues):
        raise _bad(f"{name}: a queue is named twice")
    return queues


def _object(obj: dict[str, Any], allowed: set[str]) -> None:
    _fields(obj, "command", {"v", "op", *allowed})
