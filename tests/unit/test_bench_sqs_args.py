"""tests/bench/bench_sqs.py's options: ``--profile`` without py-spy stops at once with a usage error
saying so (it ran the whole benchmark unprofiled, printing and recording no profile), as does
``--profile`` without raftmq among the targets (only raftmq's run is profiled)."""

from __future__ import annotations

import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from bench_scripts import loaded_bench


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    yield from loaded_bench("bench_sqs")


@pytest.fixture
def py_spy_dir(bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder where py-spy is looked for (beside the interpreter, and PATH), empty as yet."""
    monkeypatch.setattr(sys.modules["_common"], "PYTHON", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    return tmp_path


def test_profile_without_py_spy_is_a_usage_error_that_says_so(
    bench: ModuleType, py_spy_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        bench.parse_args(["--profile", "--targets", "raftmq"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "--profile needs py-spy" in err and "pip install py-spy" in err


def test_profile_with_py_spy_beside_the_interpreter_is_taken(bench: ModuleType, py_spy_dir: Path) -> None:
    spy = py_spy_dir / "py-spy"
    spy.write_text("#!/bin/sh\n")
    spy.chmod(spy.stat().st_mode | stat.S_IXUSR)
    args, targets = bench.parse_args(["--profile", "--targets", "raftmq"])
    assert args.profile and targets == ["raftmq"]


def test_profile_without_raftmq_among_the_targets_is_a_usage_error(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        bench.parse_args(["--profile", "--targets", "moto"])
    assert stopped.value.code == 2
    assert "add raftmq to --targets" in capsys.readouterr().err


def test_without_profile_py_spy_is_not_needed(bench: ModuleType, py_spy_dir: Path) -> None:
    args, targets = bench.parse_args([])
    assert not args.profile and targets == ["moto", "raftmq"]
