# Source me: environment for a private RabbitMQ node used by the bench (all state under $RMQ_BASE).
# Every setting can be overridden from the environment, and the
# listener comes from RABBITMQ_NODE_IP_ADDRESS/PORT (conf/rabbitmq-amqp1.conf names none).
# Usage:  . ./rabbitmq_env.sh ; taskset -c 0 /usr/lib/rabbitmq/bin/rabbitmq-server &
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)"
export RMQ_BASE=${RMQ_BASE:-/tmp/bench-rmq}
mkdir -p "$RMQ_BASE/home" "$RMQ_BASE/mnesia" "$RMQ_BASE/log"
export HOME="$RMQ_BASE/home"                      # private .erlang.cookie
export RABBITMQ_NODENAME=${RABBITMQ_NODENAME:-benchrmq@localhost}
export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
export RABBITMQ_NODE_PORT=${RABBITMQ_NODE_PORT:-29672}
export RABBITMQ_DIST_PORT=${RABBITMQ_DIST_PORT:-29673}
export ERL_EPMD_PORT=${ERL_EPMD_PORT:-29369}
export ERL_EPMD_ADDRESS=127.0.0.1
export RABBITMQ_MNESIA_BASE="$RMQ_BASE/mnesia"
export RABBITMQ_LOG_BASE="$RMQ_BASE/log"
export RABBITMQ_PID_FILE="$RMQ_BASE/rabbit.pid"
export RABBITMQ_CONFIG_FILE="$BENCH_DIR/conf/rabbitmq-amqp1.conf"
export RABBITMQ_ENABLED_PLUGINS_FILE="$RMQ_BASE/enabled_plugins"
export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+S 1:1 +SDcpu 1:1"
export RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_listen_min 29674 -kernel inet_dist_listen_max 29679"
