"""Replay job ``republish`` for spark-submit (arguments: ``raftmq.spark.replay``)::

spark-submit spark/jobs/republish.py --brokers URL --topic T ...
"""

import sys

from raftmq.spark.replay import main

if __name__ == "__main__":
    sys.exit(main(["republish", *sys.argv[1:]]))
