"""Storage: the ``Store`` protocol (``store.py``), RocksDB (``rocks.py``, the only module importing
rocksdict) and its in-memory double (``memory.py``), the key layout, the record codec, queue reads
and sealed segment files. The server (``cluster/``) builds on it; it builds on no other package."""
