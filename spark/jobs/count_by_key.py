"""Replay job ``count`` for spark-submit (arguments: ``raftmq.spark.replay``)::

spark-submit spark/jobs/count_by_key.py --brokers URL --topic T ...
"""

import sys

from raftmq.spark.replay import main

if __name__ == "__main__":
    sys.exit(main(["count", *sys.argv[1:]]))
