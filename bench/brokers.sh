#!/usr/bin/env bash
# Start/stop the AMQP 1.0 brokers for bench/amqp1_load.py, each pinned to CPU 0 (taskset -c 0), on loopback
# 29xxx ports, with private state and pid files.
#   ./brokers.sh start|stop|restart trimaran|rabbitmq-amqp1
#   ./brokers.sh pid <name>        # prints the broker PID
#   ./brokers.sh stop-all
# State (pid files, logs) lives in $BENCH_RUN (default /tmp/bench-run).  Only processes started
# here are ever stopped, by the PIDs recorded in their pid files.
#   trimaran: the `trimaran` command of $TRIMARAN_BIN; MQTT / AMQP (0.9.1 + 1.0) / HTTP on $TRIMARAN_MQTT_PORT
#     (29893) / $TRIMARAN_AMQP_PORT (29692) / $TRIMARAN_HTTP_PORT (29890); SQLite in $BENCH_RUN/trimaran-data,
#     wiped at every start.  Extra settings: TRIMARAN_* environment variables (see the README).
#   rabbitmq-amqp1: RabbitMQ 3.x (Debian's rabbitmq-server) with the rabbitmq_amqp1_0 plugin, a private node
#     (rabbitmq_env.sh: node name, ports, HOME, mnesia and logs under $RMQ_BASE, default /tmp/bench-rmq);
#     AMQP 0.9.1 and 1.0 share $RABBITMQ_NODE_PORT (29672).
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
RUN=${BENCH_RUN:-/tmp/bench-run}
BROKER_CPU=${BROKER_CPU:-0}
TRIMARAN_BIN=${TRIMARAN_BIN:-trimaran}
T_MQTT=${TRIMARAN_MQTT_PORT:-29893}
T_AMQP=${TRIMARAN_AMQP_PORT:-29692}
T_HTTP=${TRIMARAN_HTTP_PORT:-29890}
mkdir -p "$RUN"

port_of() {
  case $1 in
    trimaran) echo "$T_AMQP" ;; rabbitmq-amqp1) echo "${RABBITMQ_NODE_PORT:-29672}" ;;
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

start() {
  local b=$1 port; port=$(port_of "$b")
  if [ -f "$RUN/$b.pid" ] && kill -0 "$(cat "$RUN/$b.pid")" 2>/dev/null; then echo "$b already running"; return 0; fi
  case $b in
    trimaran)
      rm -rf "$RUN/trimaran-data"; mkdir -p "$RUN/trimaran-data"
      taskset -c "$BROKER_CPU" "$TRIMARAN_BIN" serve --mqtt "127.0.0.1:$T_MQTT" --mqtt-ws off \
        --amqp "127.0.0.1:$T_AMQP" --http "127.0.0.1:$T_HTTP" --data-dir "$RUN/trimaran-data" >"$RUN/$b.log" 2>&1 &
      echo $! >"$RUN/$b.pid" ;;
    rabbitmq-amqp1)
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
  if [ "$b" = rabbitmq-amqp1 ] && [ -f "$RUN/epmd.pid" ]; then
    kill "$(cat "$RUN/epmd.pid")" 2>/dev/null; rm -f "$RUN/epmd.pid"
  fi
  echo "$b stopped"
}

case ${1:-} in
  start) start "$2" ;;
  stop) stop "$2" ;;
  restart) stop "$2" >/dev/null; start "$2" ;;
  pid) cat "$RUN/$2.pid" ;;
  stop-all) for b in trimaran rabbitmq-amqp1; do stop $b; done ;;
  *) sed -n 2,8p "$0"; exit 2 ;;
esac
