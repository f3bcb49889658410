"""The raftmq server, in layered rooms: ``base`` → ``config`` → ``commands`` → ``machines`` →
``replication`` → ``node`` → ``api`` → ``cli``; each imports only the rooms before it
(docs/architecture.md, "Layers")."""
