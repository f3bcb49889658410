"""The parts of tests/bench/bench_backlog.py (see its docstring)."""
