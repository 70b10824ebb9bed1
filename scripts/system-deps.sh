#!/usr/bin/env bash
# System packages the test suite needs, from Debian's archive:
#   gcc, libssl-dev   python-qpid-proton has no Linux wheel and builds from source
#   postgresql        the storage tests start a throwaway cluster
#   default-jre-headless, libxerial-sqlite-jdbc-java, libpostgresql-jdbc-java
#                     the Spark audit (pyspark needs a JVM; it reads the tables over JDBC with these
#                     drivers, found at /usr/share/java/{sqlite-jdbc,postgresql}.jar)
#   chromium, chromium-driver
#                     the audit report's and the management page's browser tests (selenium)
#   rabbitmq-server, mosquitto
#                     the peers that behaviour copied from them is tested against, side by side
#   haproxy           checks deploy/cluster/haproxy.cfg (the two-node compose file's load balancer)
#   libqpid-proton11-dev, libqpid-proton11-dev-examples, pkg-config
#                     the Qpid Proton C broker example, compiled by the tests, for the AMQP 1.0 side
#                     by side runs; mosquitto also gives mosquitto_passwd for the password-file test
#   libqpid-proton-cpp12-dev, g++
#                     the proton C++ examples (colour_send, selected_recv, queue_browser), compiled by
#                     the AMQP 1.0 selector and browser tests from the -examples package's sources
# Installs what is missing when we are root (or have sudo); otherwise says what to install.
set -euo pipefail

packages=(gcc libssl-dev postgresql default-jre-headless libxerial-sqlite-jdbc-java libpostgresql-jdbc-java
          chromium chromium-driver rabbitmq-server mosquitto haproxy
          libqpid-proton11-dev libqpid-proton11-dev-examples pkg-config libqpid-proton-cpp12-dev g++)
missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: please install: ${missing[*]} (no apt-get here)" >&2
  exit 0
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo=(sudo); else
    echo "system-deps: please install as root: apt-get install ${missing[*]}" >&2
    exit 0
  fi
fi
echo "system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
if ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
  # A peer whose package scripts fail here (a service that cannot start in a container) must not stop
  # the suite: install one by one, and say what is missing; the tests that need it skip, saying why.
  for package in "${missing[@]}"; do
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$package" >/dev/null 2>&1 \
      || echo "system-deps: could not install $package" >&2
  done
fi
# Debian starts a default cluster on install; the tests start their own on a free port.
if command -v pg_lsclusters >/dev/null 2>&1; then
  "${sudo[@]}" pg_lsclusters -h 2>/dev/null | awk '{print $1, $2}' | while read -r version name; do
    "${sudo[@]}" pg_ctlcluster "$version" "$name" stop 2>/dev/null || true
  done
fi
# Debian starts the peers as services on their default ports; the tests start their own on free ones.
for service in rabbitmq-server mosquitto; do
  if command -v service >/dev/null 2>&1; then
    "${sudo[@]}" service "$service" stop >/dev/null 2>&1 || true
  fi
done
