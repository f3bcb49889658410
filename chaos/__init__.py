"""A Jepsen-style chaos harness for raftmq: nodes in containers, faults, a history, checkers.

The rooms are Jepsen's, and each is a module that knows nothing of the others' insides:

- ``images``: the container images (a Debian base from debootstrap, raftmq from a local wheelhouse).
- ``cluster``: 1, 3 or 5 nodes as containers through testcontainers, with the knobs faults need.
- ``history``: the operations of a run, one JSON object per line (invoke / ok / fail / info).
- ``client``: the workload's view of the broker through ``raftmq.client`` (produce, fetch,
  receive, ack) with every outcome classified.
- ``workload``: producers and offset consumers (the generator and the clients) and the final drain.
- ``receive``: receivers of one consumer group (receive/ack) and the group's drain.
- ``nemesis``: faults on a seeded schedule, recorded in the same history.
- ``checkers``: pure functions over a history (total queue, log consistency, order, lost write,
  availability; ``receive_checker``: at-least-once through receive/ack).
- ``logscan``: alert lines and tracebacks in the nodes' logs.
- ``report``: ``store/<test>/<timestamp>/`` with the history, results, plots and a summary.
- ``runner``: one test from start to report; ``cli``: the ``raftmq-chaos`` command.

Importing this package imports nothing heavy: docker, testcontainers and matplotlib load only in the
modules that need them, so the checkers run anywhere.
"""
