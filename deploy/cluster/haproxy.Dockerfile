# HAProxy from Debian's packages, for deploy/compose.cluster.yaml.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends haproxy \
 && rm -rf /var/lib/apt/lists/*
USER haproxy
CMD ["haproxy", "-W", "-db", "-f", "/etc/haproxy/haproxy.cfg"]
