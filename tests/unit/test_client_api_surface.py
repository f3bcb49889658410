"""The client's public surface: ``__all__`` lists every public name, and the package is typed."""

from __future__ import annotations

import inspect
import types
import typing
from pathlib import Path
from typing import Any

import raftmq.client
from raftmq import errors as shared
from raftmq.client import errors, lowlevel


def test_all_names_exist_once() -> None:
    for module in [raftmq.client, errors, lowlevel]:
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.__all__ lists missing {name}"
        assert len(module.__all__) == len(set(module.__all__))


def test_every_public_name_of_the_package_is_in_all() -> None:
    public = {
        name
        for name, obj in vars(raftmq.client).items()
        if not name.startswith("_") and not isinstance(obj, types.ModuleType) and name != "annotations"
    }
    assert public == set(raftmq.client.__all__)


def test_every_public_name_of_the_errors_module_is_in_all() -> None:
    public = {
        name
        for name, obj in vars(errors).items()
        if not name.startswith("_")
        and getattr(obj, "__module__", errors.__name__) == errors.__name__
        and not isinstance(obj, types.ModuleType)
        and name != "annotations"
    }
    public |= {"BY_CODE", "CLIENT_CODES"}
    # The classes the client shares with the server (raftmq.errors: the root, BadBatch,
    # OffsetOutOfRange) are the client's too.
    public |= {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, shared.RaftmqError) and obj.__module__ == shared.__name__
    }
    assert public - {"Any", "ClassVar", "Mapping", "MappingProxyType"} == set(errors.__all__)


def test_every_error_class_is_exported_by_the_package() -> None:
    for name in errors.__all__:
        if inspect.isclass(getattr(errors, name)):
            assert name in raftmq.client.__all__, name


def _client_types(hint: Any) -> set[type]:
    found: set[type] = set()
    if isinstance(hint, type) and hint.__module__.startswith("raftmq.client"):
        found.add(hint)
    for arg in typing.get_args(hint):
        if isinstance(arg, list):
            for a in arg:
                found |= _client_types(a)
        else:
            found |= _client_types(arg)
    return found


def test_every_client_type_in_a_public_signature_is_exported() -> None:
    exported = {getattr(raftmq.client, n) for n in raftmq.client.__all__}
    for name in raftmq.client.__all__:
        cls = getattr(raftmq.client, name)
        if not inspect.isclass(cls) or issubclass(cls, BaseException):
            continue
        members = [m for n, m in vars(cls).items() if not n.startswith("_") or n == "__init__"]
        for member in members:
            func = member.fget if isinstance(member, property) else member
            if not callable(func):
                continue
            for param, hint in typing.get_type_hints(func).items():
                if param.startswith("_"):
                    continue  # a private parameter (Message's ``_window``, set by the consumer)
                missing = _client_types(hint) - exported
                assert not missing, f"{name}.{getattr(func, '__name__', '?')} uses unexported {missing}"


def test_the_package_is_typed() -> None:
    assert (Path(raftmq.client.__file__).parent / "py.typed").exists()


def test_every_public_name_of_the_lowlevel_module_is_in_all() -> None:
    public = {
        name
        for name, obj in vars(lowlevel).items()
        if not name.startswith("_") and not isinstance(obj, types.ModuleType) and name != "annotations"
    }
    assert public == set(lowlevel.__all__)


def test_chaos_and_the_cli_use_the_lowlevel_module_not_private_ones() -> None:
    root = Path(raftmq.client.__file__).resolve().parents[1]
    for path in [root / "chaos" / "client.py", root / "cluster" / "cli" / "delivery.py"]:
        text = path.read_text(encoding="utf-8")
        assert "raftmq.client.lowlevel" in text, path
        assert "raftmq.client._" not in text, path
