"""Replay job ``copy`` for spark-submit (arguments: ``raftmq.spark.replay``)::

spark-submit spark/jobs/copy_to_parquet.py --brokers URL --topic T ...
"""

import sys

from raftmq.spark.replay import main

if __name__ == "__main__":
    sys.exit(main(["copy", *sys.argv[1:]]))
