#!/usr/bin/env bash
# Start/stop the servers of the bench, each pinned to CPU $BROKER_CPU (0) with taskset, on loopback 29xxx ports.
#   ./brokers.sh start|stop|restart <name>     ./brokers.sh pid <name>     ./brokers.sh stop-all
# Names:
#   trimaran, trimaran-<x>: python -m trimaran serve with $TRIMARAN_PY (default: the repository's .venv python)
#     and PYTHONPATH=$TRIMARAN_SRC (default: this checkout), or the command $TRIMARAN_BIN when set; MQTT / AMQP
#     (0.9.1 + 1.0) / HTTP on $TRIMARAN_MQTT_PORT (29893) / $TRIMARAN_AMQP_PORT (29692) / $TRIMARAN_HTTP_PORT
#     (29890); SQLite in $BENCH_RUN/<name>-data, wiped at every start.  Extra settings: TRIMARAN_* variables.
#     TRIMARAN_CPU_SHARE=0.5 gives it half of its core (a CPU cgroup, 5 ms of every 10): a host where Python
#     runs at half speed while the peers do not.
#   mosquitto, mosquitto-nodelay: Debian's mosquitto with conf/<name>.conf (29883, 29888).
#   mosquitto-bridge: the same, with a bridge to mosquitto-remote (29886); mosquitto-remote: the bridge
#     row's remote (29887), pinned to CPU $REMOTE_CPU (1), beside the generator.
#   rabbitmq (alias rabbitmq-amqp1): Debian's rabbitmq-server, a private node (rabbitmq_env.sh: node name,
#     ports, HOME, mnesia and logs under $RMQ_BASE, default /tmp/bench-rmq) with the rabbitmq_amqp1_0 plugin;
#     AMQP 0.9.1 and 1.0 share $RABBITMQ_NODE_PORT (29672).
#   relay: relay_ceiling.py, the uvloop MQTT QoS 0 relay (29885), run by $BENCH_PY.
#   proton-broker: qpid-proton's C example broker, built by run.py into $PROTON_C (29695).
# State (pid files, logs) lives in $BENCH_RUN (default /tmp/bench-run).  Only processes started here are ever
# stopped, by the PIDs recorded in their pid files.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(dirname "$HERE")"
RUN=${BENCH_RUN:-/tmp/bench-run}
BROKER_CPU=${BROKER_CPU:-0}
REMOTE_CPU=${REMOTE_CPU:-1}
PY=${BENCH_PY:-$REPO/.venv/bin/python}
TRIMARAN_PY=${TRIMARAN_PY:-$REPO/.venv/bin/python}
TRIMARAN_SRC=${TRIMARAN_SRC:-$REPO}
TRIMARAN_BIN=${TRIMARAN_BIN:-}
T_MQTT=${TRIMARAN_MQTT_PORT:-29893}
T_AMQP=${TRIMARAN_AMQP_PORT:-29692}
T_HTTP=${TRIMARAN_HTTP_PORT:-29890}
mkdir -p "$RUN"
RUN=$(cd "$RUN" && pwd)
PROTON_C=${PROTON_C:-$RUN/proton-c}

port_of() {
  case $1 in
    trimaran|trimaran-*) echo "$T_AMQP" ;;
    mosquitto) echo 29883 ;; mosquitto-nodelay) echo 29888 ;; relay) echo 29885 ;; proton-broker) echo 29695 ;;
    mosquitto-bridge) echo 29886 ;; mosquitto-remote) echo 29887 ;;
    rabbitmq|rabbitmq-amqp1) echo "${RABBITMQ_NODE_PORT:-29672}" ;;
    *) echo "unknown broker $1" >&2; exit 2 ;;
  esac
}

wait_port() {  # port timeout_s
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    if ss -ltn "sport = :$1" | grep -q LISTEN; then return 0; fi
    sleep 0.1
  done
  echo "port $1 did not open" >&2; return 1
}

cpu_share() {  # name share pid: the process (and the threads it starts) gets share of a CPU, 10 ms periods
  local quota; quota=$(awk -v s="$2" 'BEGIN { printf "%d", s * 10000 }')
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then  # cgroup v2
    local cg=/sys/fs/cgroup/bench-$1
    mkdir -p "$cg" && echo "$quota 10000" >"$cg/cpu.max" && echo "$3" >"$cg/cgroup.procs" && return 0
  elif [ -d /sys/fs/cgroup/cpu ]; then  # v1
    local cg=/sys/fs/cgroup/cpu/bench-$1
    mkdir -p "$cg" && echo 10000 >"$cg/cpu.cfs_period_us" && echo "$quota" >"$cg/cpu.cfs_quota_us" \
      && echo "$3" >"$cg/cgroup.procs" && return 0
  fi
  echo "no CPU cgroup to limit $1 to $2 of a CPU (root and a cpu controller are needed)" >&2; return 1
}

start() {
  local b=$1 port; port=$(port_of "$b")
  if [ -f "$RUN/$b.pid" ] && kill -0 "$(cat "$RUN/$b.pid")" 2>/dev/null; then echo "$b already running"; return 0; fi
  case $b in
    trimaran|trimaran-*)
      rm -rf "$RUN/$b-data"; mkdir -p "$RUN/$b-data"
      local cmd=("$TRIMARAN_PY" -m trimaran)
      [ -n "$TRIMARAN_BIN" ] && cmd=("$TRIMARAN_BIN")
      # from the tree itself: `python -m` puts the working directory first on sys.path
      ( if [ -n "${TRIMARAN_CPU_SHARE:-}" ]; then cpu_share "$b" "$TRIMARAN_CPU_SHARE" $BASHPID || exit 1; fi
        cd "$TRIMARAN_SRC" && PYTHONPATH="$TRIMARAN_SRC" exec taskset -c "$BROKER_CPU" "${cmd[@]}" serve \
          --mqtt "127.0.0.1:$T_MQTT" --mqtt-ws off --amqp "127.0.0.1:$T_AMQP" --http "127.0.0.1:$T_HTTP" \
          --data-dir "$RUN/$b-data" >"$RUN/$b.log" 2>&1 ) &
      echo $! >"$RUN/$b.pid"
      wait_port "$T_MQTT" 60 || return 1 ;;
    mosquitto|mosquitto-nodelay|mosquitto-bridge)
      taskset -c "$BROKER_CPU" mosquitto -c "$HERE/conf/$b.conf" >"$RUN/$b.log" 2>&1 &
      echo $! >"$RUN/$b.pid" ;;
    mosquitto-remote)
      taskset -c "$REMOTE_CPU" mosquitto -c "$HERE/conf/$b.conf" >"$RUN/$b.log" 2>&1 &
      echo $! >"$RUN/$b.pid" ;;
    relay)
      taskset -c "$BROKER_CPU" "$PY" "$HERE/relay_ceiling.py" --port "$port" >"$RUN/$b.log" 2>&1 &
      echo $! >"$RUN/$b.pid" ;;
    proton-broker)
      # the example reads ssl-certs/ relative to its working directory (TLS is not used here)
      ( cd "$PROTON_C" && exec taskset -c "$BROKER_CPU" ./broker 127.0.0.1 "$port" >"$RUN/$b.log" 2>&1 ) &
      echo $! >"$RUN/$b.pid" ;;
    rabbitmq|rabbitmq-amqp1)
      # shellcheck source=rabbitmq_env.sh
      ( . "$HERE/rabbitmq_env.sh"
        echo "[rabbitmq_amqp1_0]." >"$RABBITMQ_ENABLED_PLUGINS_FILE"
        if ! ss -ltn "sport = :$ERL_EPMD_PORT" | grep -q LISTEN; then
          epmd -port "$ERL_EPMD_PORT" -address 127.0.0.1 >"$RUN/epmd.log" 2>&1 &
          echo $! >"$RUN/epmd.pid"
          sleep 0.5
        fi
        rm -f "$RABBITMQ_PID_FILE"
        taskset -c "$BROKER_CPU" /usr/lib/rabbitmq/bin/rabbitmq-server >"$RUN/$b.log" 2>&1 &
        for _ in $(seq 1 300); do [ -s "$RABBITMQ_PID_FILE" ] && break; sleep 0.1; done
        cat "$RABBITMQ_PID_FILE" >"$RUN/$b.pid" ) ;;
  esac
  wait_port "$port" 90 && echo "$b started pid $(cat "$RUN/$b.pid") port $port cpu $BROKER_CPU"
}

stop() {
  local b=$1 pid
  [ -f "$RUN/$b.pid" ] || return 0
  pid=$(cat "$RUN/$b.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$RUN/$b.pid"
  rmdir "/sys/fs/cgroup/bench-$b" "/sys/fs/cgroup/cpu/bench-$b" 2>/dev/null  # cpu_share's, when empty
  if [[ $b == rabbitmq* ]] && [ -f "$RUN/epmd.pid" ]; then
    kill "$(cat "$RUN/epmd.pid")" 2>/dev/null; rm -f "$RUN/epmd.pid"
  fi
  echo "$b stopped"
}

case ${1:-} in
  start) start "$2" ;;
  stop) stop "$2" ;;
  restart) stop "$2" >/dev/null; start "$2" ;;
  pid) cat "$RUN/$2.pid" ;;
  stop-all)
    for f in "$RUN"/*.pid; do
      b=$(basename "$f" .pid)
      [ -f "$f" ] && [ "$b" != epmd ] && stop "$b"
    done ;;
  *) sed -n 2,17p "$0"; exit 2 ;;
esac
