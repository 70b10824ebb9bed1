#!/usr/bin/env bash
# What a tenant costs (issue 33): MQTT QoS 0 fan-in and AMQP 0.9.1 transient against a server in the
# default vhost without rules, and against one whose clients are in vhost t1 under a rule file with a
# deny inside the readable tree (so that the fan-in's wildcard subscription is read in part, each
# topic decided once). The two servers alternate, ROUNDS times, pinned to CPU 0 like make bench's;
# the generators run on CPU 1. Prints one JSON line a run (the generators' own) to OUT.
#
#   bench/tenant_cost.sh                 # ROUNDS=2 OUT=bench/results/<date>-tenant-cost.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ROUNDS=${ROUNDS:-2}
OUT=${OUT:-bench/results/$(date +%F)-tenant-cost.jsonl}
FLAGS=(--runs 1 --warmup 2 --duration 10 --quiet-pct 15 --quiet-wait 60 --max-foreign-pct 8 --out "$OUT")
MQTT_PORT=29983
AMQP_PORT=29984
work=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; rm -rf "$work"' EXIT

cat > "$work/acl" <<'EOF'
topic deny bench/+/fanin/secret
topic readwrite bench/#
topic all $queue/#
EOF

start() {  # start plain|tenant
  rm -rf "$work/data"
  local env=(TRIMARAN_STORAGE__DATA_DIR="$work/data")
  if [ "$1" = tenant ]; then
    env+=(TRIMARAN_VHOSTS='["/", "t1"]' TRIMARAN_LISTENERS__VHOSTS='{"mqtt": "t1"}'
          TRIMARAN_AUTH__ACL_FILE="$work/acl")
  fi
  env "${env[@]}" taskset -c 0 "$PY" -m trimaran serve --mqtt "127.0.0.1:$MQTT_PORT" --mqtt-ws off \
    --amqp "127.0.0.1:$AMQP_PORT" --http off > "$work/server.log" 2>&1 &
  server=$!
  for _ in $(seq 100); do grep -q "trimaran ready" "$work/server.log" && return; sleep 0.1; done
  cat "$work/server.log" >&2
  exit 1
}

for round in $(seq "$ROUNDS"); do
  for kind in plain tenant; do
    vhost=/
    [ "$kind" = tenant ] && vhost=t1
    start "$kind"
    taskset -c 1 "$PY" bench/mqtt_load.py fanin --qos 0 --e2e-window 5000 --port "$MQTT_PORT" \
      --label "$kind-r$round" "${FLAGS[@]}" | tail -1
    taskset -c 1 "$PY" bench/amqp091_load.py transient --e2e-window 5000 --port "$AMQP_PORT" \
      --vhost "$vhost" --label "$kind-r$round" "${FLAGS[@]}" | tail -1
    kill "$server"
    wait "$server" 2>/dev/null || true
  done
done
echo "raw lines: $OUT"
