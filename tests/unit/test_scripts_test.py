"""``./scripts/test`` with pytest arguments goes straight to pytest once ``.venv`` is set up (issue 21:
51 s for 7.85 s of tests, spent setting up Spark and chaos and linting every file first); without
arguments it does everything. Run on a copy of the scripts whose ``.venv/bin`` tools only record
their calls: what is proved is the scripts' own order of work."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

if not Path("/usr/bin/chromium").exists():  # a set-up `test` extra includes it (scripts/setup)
    pytest.skip("/usr/bin/chromium is missing: run ./scripts/setup test", allow_module_level=True)


def _recorder(path: Path, name: str, then: str = "exit 0") -> None:
    path.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >>"$CALLS"\n{then}\n')
    path.chmod(0o755)


def _repo(tmp_path: Path, stamp_extras: str | None) -> Path:
    """scripts/test and scripts/setup with pyproject.toml, a .venv whose python is the real one
    except that ``-m pip`` is only recorded, and recording ruff, mypy, pytest, chaos and deploy-test."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("test", "setup"):
        shutil.copy2(ROOT / "scripts" / name, repo / "scripts" / name)
    for name in ("chaos", "deploy-test"):
        _recorder(repo / "scripts" / name, name)
    shutil.copy2(ROOT / "pyproject.toml", repo / "pyproject.toml")
    bin_dir = repo / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "pip $*" >>"$CALLS"; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    for name in ("ruff", "mypy", "pytest"):
        _recorder(bin_dir / name, name)
    if stamp_extras is not None:
        digest = subprocess.run(
            ["sha256sum", "pyproject.toml"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.split()[0]
        (repo / ".venv" / "raftmq-setup").write_text(f"{digest} {stamp_extras}\n")
    return repo


def _run(repo: Path, *args: str) -> list[str]:
    calls = repo / "calls.log"
    calls.write_text("")
    subprocess.run(
        ["bash", "scripts/test", *args],
        cwd=repo,
        env={"CALLS": str(calls), "PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
        check=True,
    )
    return calls.read_text().splitlines()


def test_a_narrowed_run_on_a_set_up_venv_runs_pytest_alone(tmp_path: Path) -> None:
    repo = _repo(tmp_path, stamp_extras="test")
    assert _run(repo, "-k", "test_cli_help", "-q") == ["pytest -k test_cli_help -q"]


def test_a_narrowed_run_sets_up_the_test_extra_only_when_the_venv_is_not_set_up(tmp_path: Path) -> None:
    repo = _repo(tmp_path, stamp_extras=None)
    calls = _run(repo, "tests/unit/test_cli_help.py")
    assert [c.split()[0] for c in calls] == ["pip", "pytest"], calls
    assert calls[0].endswith("-e .[test]") and calls[1] == "pytest tests/unit/test_cli_help.py"
    # The stamp now says so: the next narrowed run installs nothing.
    assert _run(repo, "-x") == ["pytest -x"]


def test_a_changed_pyproject_is_set_up_again(tmp_path: Path) -> None:
    repo = _repo(tmp_path, stamp_extras="chaos,spark,test")
    with (repo / "pyproject.toml").open("a") as f:
        f.write("\n# a new dependency\n")
    assert [c.split()[0] for c in _run(repo, "-x")] == ["pip", "pytest"]


def test_the_whole_run_sets_up_every_extra_and_runs_lint_types_chaos_deploy_and_pytest(
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path, stamp_extras="chaos,spark,test")  # set up: no pip
    calls = _run(repo)
    whole = ["ruff", "mypy", "pytest --collect-only", "chaos", "deploy-test", "pytest"]
    assert [_tool(c) for c in calls] == whole, calls
    repo = _repo(tmp_path / "fresh", stamp_extras=None)
    calls = _run(repo)
    assert calls[0].startswith("pip") and calls[0].endswith("-e .[test,spark,chaos]"), calls
    assert [_tool(c) for c in calls[1:]] == whole


def _tool(call: str) -> str:
    """A recorded call's tool, with ``--collect-only`` when pytest only collected."""
    words = call.split()
    return f"{words[0]} --collect-only" if "--collect-only" in words else words[0]


def test_a_test_that_cannot_be_collected_stops_the_whole_run_before_the_chaos_suite(tmp_path: Path) -> None:
    """An import error in one test file failed CI only after the chaos and deploy suites (12 minutes):
    the collection goes first, and what it printed is shown."""
    repo = _repo(tmp_path, stamp_extras="chaos,spark,test")
    _recorder(
        repo / ".venv" / "bin" / "pytest",
        "pytest",
        then='if [[ " $* " == *" --collect-only "* ]]; then echo "ERROR collecting test_x.py"; exit 2; fi',
    )
    calls = repo / "calls.log"
    calls.write_text("")
    run = subprocess.run(
        ["bash", "scripts/test"],
        cwd=repo,
        env={"CALLS": str(calls), "PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0
    assert "ERROR collecting test_x.py" in run.stdout
    assert [_tool(c) for c in calls.read_text().splitlines()] == ["ruff", "mypy", "pytest --collect-only"]
