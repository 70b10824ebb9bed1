#!/usr/bin/env bash
# AMQP 1.0: Trimaran and RabbitMQ (3.x, rabbitmq_amqp1_0 plugin) side by side with bench/amqp1_load.py, in one
# session and under the bench's rules (broker on CPU 0, generator on CPU 1, 2 s warm-up + 10 s window,
# 3 clean runs, runs with more than 8% of a core used by other tenants retried).  Scenarios are interleaved
# (every broker runs scenario A, then every broker runs scenario B, ...).
#   ./run_amqp1.sh                                            # about 25 min on a quiet machine
# Results: results/$PREFIX-amqp1-<label>.jsonl (PREFIX defaults to the date); summary lines on stdout.
set -u
cd "$(dirname "$0")"
PY=${BENCH_PY:-../.venv/bin/python}
GEN_CPU=${GEN_CPU:-1}
RUNS=${RUNS:-3}
PREFIX=${PREFIX:-$(date +%F)}
COMMON=${COMMON:-"--runs $RUNS --warmup 2 --duration 10 --quiet-pct 15 --quiet-wait 60 --max-foreign-pct 8"}
OUT=results
mkdir -p "$OUT"
export TRIMARAN_BIN=${TRIMARAN_BIN:-}   # empty: brokers.sh runs this checkout with the .venv's python
T_PORT=${TRIMARAN_AMQP_PORT:-29692}
R_PORT=${RABBITMQ_NODE_PORT:-29672}

run() {  # label broker-args... scenario-args...
  local label=$1; shift
  echo "--- $(date +%T) $label $*"
  # shellcheck disable=SC2086
  taskset -c "$GEN_CPU" "$PY" amqp1_load.py "$@" --label "$label" --out "$OUT/$PREFIX-amqp1-$label.jsonl" $COMMON \
    | tail -1 | "$PY" -c 'import json, sys; d = json.loads(sys.stdin.read()); print(d.get("ok_runs"), "ok", d.get("median"))'
}

./brokers.sh restart trimaran
./brokers.sh restart rabbitmq-amqp1
for sc in "settled" "settled --e2e-window 5000" "unsettled" "unsettled --e2e-window 5000"; do
  # shellcheck disable=SC2086
  run trimaran --port "$T_PORT" $sc                                   # queue://, durable in SQLite
  # shellcheck disable=SC2086
  run rabbitmq --broker rabbitmq --port "$R_PORT" $sc                 # transient queue, non-durable messages
  # shellcheck disable=SC2086
  run rabbitmq-durable --broker rabbitmq --port "$R_PORT" --durable $sc  # durable queue, durable messages
done
# Trimaran's non-durable path: a topic (the receiver's credit is its only buffer; overflow is dropped, counted)
run trimaran-topic --port "$T_PORT" --address 'topic://bench/{q}' settled --e2e-window 5000
./brokers.sh stop rabbitmq-amqp1
./brokers.sh stop trimaran
echo "=== done $(date +%T)"
