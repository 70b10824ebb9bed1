#!/usr/bin/env bash
# Run the Trimaran queue audit on a Spark cluster with spark-submit.
#
#   deploy/spark/audit.sh spark://master:7077 postgresql://audit@db:5432/trimaran /shared/audit-report
#
# The executors need Python with pyspark, pyarrow and pandas (same versions as the driver); the
# trimaran package travels as a zip (--py-files), the JDBC drivers as --jars. Pass extra audit
# options after the three arguments (e.g. --since 2026-11-01 --queue orders).
set -euo pipefail
master=${1:?spark master URL, e.g. spark://host:7077 or yarn}
storage=${2:?storage URL, e.g. postgresql://user@host/db}
output=${3:?report directory (shared, or local to the driver)}
shift 3
here="$(cd "$(dirname "$0")/../.." && pwd)"
jars=${TRIMARAN_JDBC_JARS:-/usr/share/java/postgresql.jar,/usr/share/java/sqlite-jdbc.jar}

bundle="$(mktemp -d)/trimaran.zip"
(cd "$here" && zip -qr "$bundle" trimaran -x '*/__pycache__/*')

exec spark-submit \
  --master "$master" \
  --name trimaran-audit \
  --jars "$jars" \
  --py-files "$bundle" \
  --conf spark.ui.showConsoleProgress=true \
  "$here/trimaran/analytics/replay.py" \
  --storage "$storage" --output "$output" "$@"
