"""The ``raftmq`` command line (``cli/main.py``): nodes, a local cluster, administration."""
