"""What a chaos spec's counts mean: None is the default, 0 is none, and a spec the run cannot honour
is refused before the report directory (and so any container) exists. No docker: the refusals come
first, and the accepted specs are only turned into the workers' configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from raftmq.chaos import runner
from raftmq.chaos.cli import main
from raftmq.chaos.runner import ChaosSpec


@pytest.mark.parametrize(
    ("counts", "refusal"),
    [
        ({"queues": 0}, "queues must be at least 1"),
        ({"producers": -1}, "producers must be at least 0"),
        ({"workload": "receive", "receivers": -2}, "receivers must be at least 0"),
        # The workload's producers are the only writers: 0 of them is a run that checks nothing.
        ({"producers": 0}, "nothing would write"),
        ({"workload": "sqs", "sqs_senders": 0}, "nothing would write"),
        ({"producers": 0, "load_rate": 100.0, "load_producers": 0}, "nothing would write"),
        ({"workload": "bogus"}, "workload must be one of"),
        # Writers with no rate: producers that never produce, senders that never send.
        ({"rate": 0.0}, "rate must be above 0"),
        ({"rate": -5.0, "load_rate": 100.0}, "rate must be above 0"),
        ({"workload": "sqs", "sqs_rate": 0.0}, "sqs_rate must be above 0"),
        ({"workload": "all", "sqs_rate": -1.0}, "sqs_rate must be above 0"),
        # A negative load count: none, or (load_producers) one that cancelled a real writer.
        ({"load_rate": 100.0, "load_producers": -3}, "load_producers must be at least 0"),
        ({"producers": 1, "load_rate": 100.0, "load_producers": -1}, "load_producers must be at least 0"),
        ({"load_rate": 100.0, "load_processes": -1}, "load_processes must be at least 0"),
        ({"load_rate": 100.0, "load_consumers": -1}, "load_consumers must be at least 0"),
        ({"load_rate": -1.0}, "load_rate must be at least 0"),
        # The load writes through the REST API: the SQS workload's checker would see no send.
        ({"workload": "sqs", "sqs_senders": 0, "load_rate": 100.0}, "the sqs workload needs sqs_senders"),
        # The REST producers write, but the SQS checker would pass on an empty history.
        ({"workload": "all", "sqs_senders": 0}, "the all workload needs sqs_senders"),
    ],
)
def test_a_spec_the_run_cannot_honour_is_refused_before_its_report_directory(
    counts: dict[str, object], refusal: str, tmp_path: Path
) -> None:
    # A file where the report directory would go: a run that began would fail making it
    # (NotADirectoryError), before any container starts.
    store = tmp_path / "store"
    store.write_text("")
    with pytest.raises(ValueError, match=refusal):
        runner.run(ChaosSpec(faults=(), store=store, **counts))  # type: ignore[arg-type]


def test_zero_workers_of_a_kind_are_none_not_the_default() -> None:
    """A consume-only workload (the load writes), receivers or SQS workers 0: none of them."""
    only_load = ChaosSpec(faults=(), producers=0, load_rate=100.0)
    runner.check_spec(only_load)
    config = runner._workload_config(only_load)
    assert (config.producers, config.consumers, config.queues) == (0, 3, 6)
    quiet = ChaosSpec(faults=(), workload="all", receivers=0, sqs_senders=1, sqs_receivers=0)
    runner.check_spec(quiet)
    receive, sqs = runner._receive_config(quiet), runner._sqs_config(quiet)
    assert receive is not None and receive.receivers == 0
    assert sqs is not None and (sqs.senders, sqs.receivers) == (1, 0)
    # 0 SQS senders are none too, which is why that spec is refused (an SQS history left empty).
    silent = ChaosSpec(faults=(), workload="all", sqs_senders=0)
    sqs = runner._sqs_config(silent)
    assert sqs is not None and sqs.senders == 0
    with pytest.raises(ValueError, match="needs sqs_senders"):
        runner.check_spec(silent)


def test_none_is_the_default_per_node() -> None:
    spec = ChaosSpec(nodes=5, faults=(), workload="all")
    config = runner._workload_config(spec)
    receive, sqs = runner._receive_config(spec), runner._sqs_config(spec)
    assert (config.queues, config.producers, config.consumers) == (10, 40, 5)
    assert receive is not None and receive.receivers == 5
    assert sqs is not None and (sqs.senders, sqs.receivers) == (5, 5)


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        (["--producers", "-1"], "Invalid value for '--producers'"),  # the option's IntRange
        (["--producers", "0"], "nothing would write"),  # check_spec: no load, no SQS workload
        (["--workload", "sqs", "--sqs-rate", "5", "--load-rate", "100"], None),  # accepted: runs
    ],
)
def test_the_cli_refuses_a_spec_as_a_usage_error_before_building_images(
    args: list[str], refusal: str | None, tmp_path: Path
) -> None:
    """A refused spec is a usage error (click's exit status 2 with its usage line), told before any
    image is built, not a harness failure logged after the build. ``--no-build`` and a file where
    the run's folder would go: an accepted spec fails making its report directory, before any
    container starts."""
    (tmp_path / "blocked").write_text("")
    options = ["--no-build", "--store", str(tmp_path), "--name", "blocked", "--nemesis", "none"]
    got = CliRunner().invoke(main, [*args, *options])
    if refusal is None:
        assert got.exit_code == 2 and "Usage:" not in got.output, got.output  # the run's failure
        return
    assert got.exit_code == 2, got.output
    assert "Usage: " in got.output and refusal in got.output, got.output
