# The raftmq server image: one node per container (docs/deploy.md).
#
#   docker build -t raftmq .                                   # on python:3.11-slim
#   docker build --build-arg BASE=raftmq-base:bookworm -t raftmq .   # no registry: the debootstrap
#                                                              # base of `raftmq-chaos --build-only`
#
# BASE must be Debian-like with python3 (3.11+) and its venv module: python:3.11-slim and
# raftmq-base:bookworm both are (the latter has no `python`/`pip` commands, so only `python3 -m`
# is used here). The wheels come from docker/wheelhouse/ when it holds all of them, otherwise pip
# asks the package index; no container registry is needed beyond BASE. Works with the legacy
# builder and BuildKit alike.
ARG BASE=python:3.11-slim

# -- build: raftmq's wheel and the wheels of its dependencies ----------------------------------------
FROM ${BASE} AS build
WORKDIR /src
COPY . /src
RUN set -eu; \
    python3 -m venv /opt/build; \
    pip="/opt/build/bin/pip --disable-pip-version-check wheel -q -w /wheels/deps"; \
    if [ -d docker/wheelhouse ] && $pip --no-index --find-links docker/wheelhouse . 2>/tmp/offline.log; then \
        echo "wheels: all from docker/wheelhouse"; \
    else \
        echo "wheels: from the package index"; \
        if [ -d docker/wheelhouse ]; then $pip --find-links docker/wheelhouse .; else $pip .; fi; \
    fi; \
    mkdir -p /wheels/app; \
    mv /wheels/deps/raftmq-*.whl /wheels/app/

# -- the image ---------------------------------------------------------------------------------------
FROM ${BASE}
LABEL org.opencontainers.image.title="raftmq" \
      org.opencontainers.image.description="Highly available message broker: Raft-replicated queue groups on RocksDB" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.raftmq.image=server

RUN groupadd --system --gid 10001 raftmq \
    && useradd --system --uid 10001 --gid raftmq --home-dir /var/lib/raftmq --no-create-home \
       --shell /usr/sbin/nologin raftmq \
    && mkdir -p /var/lib/raftmq /etc/raftmq \
    && chown raftmq:raftmq /var/lib/raftmq && chmod 0750 /var/lib/raftmq

# Dependencies first: this layer stays cached while only raftmq's own code changes.
COPY --from=build /wheels/deps/ /tmp/deps/
RUN python3 -m venv /opt/raftmq \
    && /opt/raftmq/bin/pip install --disable-pip-version-check --no-cache-dir -q --no-index /tmp/deps/*.whl \
    && rm -rf /tmp/deps
COPY --from=build /wheels/app/ /tmp/app/
RUN /opt/raftmq/bin/pip install --disable-pip-version-check --no-cache-dir -q --no-index --no-deps \
       /tmp/app/*.whl \
    && rm -rf /tmp/app

COPY deploy/docker/entrypoint.sh /usr/local/bin/raftmq-entrypoint
COPY deploy/docker/healthcheck.py /usr/local/bin/raftmq-healthcheck

# RAFTMQ_NODE (this container's node id) and RAFTMQ_SECRET (the cluster secret, at least 16
# characters) come from the environment; the cluster file is mounted at RAFTMQ_CONFIG.
ENV PATH=/opt/raftmq/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    RAFTMQ_CONFIG=/etc/raftmq/cluster.toml

USER raftmq
WORKDIR /var/lib/raftmq
VOLUME ["/var/lib/raftmq"]
# The HTTP API, then the Raft ports of deploy/compose/cluster.toml: the metadata group on the base
# port 7100, queue group g on 7101+g (3 groups). Publish the HTTP port only; the Raft ports belong
# on the cluster network.
EXPOSE 8080 7100-7103
HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=3 CMD ["raftmq-healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["raftmq-entrypoint"]
