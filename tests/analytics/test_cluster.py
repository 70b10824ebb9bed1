"""The audit on a real Spark standalone cluster, run as a user runs it: ``trimaran audit --master
spark://...`` in a subprocess.

The master and the worker are the pyspark package's own (``spark-class``), on 127.0.0.1. The
executors' Python (``PYSPARK_PYTHON``) is a venv whose site-packages links only pyspark, pyarrow,
pandas and what they require, from this interpreter's installation: it cannot import Trimaran, so
every clean run proves that the audit shipped its code. Each source (a Parquet export, SQLite over
JDBC, PostgreSQL over JDBC as a read-only role) is audited clean (exit 0), then with one event
deleted (exit 1). The ways the audit cannot run are one line on stderr and exit 2.

Each audit on the cluster starts two JVMs (the driver's and an executor's) and takes 15-20 s on the
2-CPU test host, so every test on the cluster is ``slow`` (``make test-all``): SQLite's clean audit
and its fault, Parquet, PostgreSQL, the executor that never starts and the executors that cannot
import pyarrow. The default suite runs what needs no cluster: the shipped bundle imported by the
executors' Python, the quiet audit's progress lines, and the ways the audit cannot run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from packaging.requirements import Requirement
from pyspark.sql import SparkSession

from tests.analytics.conftest import write_broker_tables
from tests.support.postgres import PostgresCluster
from tests.support.server import unused_port
from trimaran.analytics.cluster import bundle
from trimaran.analytics.replay import add_arguments, run_audit
from trimaran.analytics.source import MIN_ROWS_PER_SLICE, ROWS_PER_SLICE, TABLES, slice_count

# Small tables: the settings of the local session fixture (conftest.py), given as a user would; and
# short-lived JVMs: the client compiler only, whose quick start beats C2 on runs of seconds (a
# third off each audit here).
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SMALL_TABLES = {
    "spark.driver.extraJavaOptions": FAST_JVM,
    "spark.executor.extraJavaOptions": FAST_JVM,
    "spark.ui.enabled": "false",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.defaultSizeInBytes": str(1 << 20),
    "spark.executor.memory": "512m",
}
WORKER_CORES = 2


# -- the executors' Python: pyspark, pyarrow and pandas, no Trimaran ---------------------------------


def executor_venv(target: Path, packages: tuple[str, ...] = ("pyspark", "pyarrow", "pandas")) -> Path:
    """A venv (no pip, no system site-packages) whose site-packages links ``packages`` and their
    requirements from this interpreter's installation; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True, timeout=60)
    site = next(target.glob("lib/python*/site-packages"))
    todo, seen = list(packages), set()
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        name = dist.metadata["Name"].lower()
        if name in seen:
            continue
        seen.add(name)
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            source = Path(str(dist.locate_file(top)))
            if top != ".." and not top.endswith(".pth") and source.exists():
                (site / top).unlink(missing_ok=True)
                (site / top).symlink_to(source)
    return target / "bin" / "python"


@pytest.fixture(scope="module")
def executor_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("executor-venv")
    python = executor_venv(root / "venv")
    found = subprocess.run(  # from a directory without Trimaran, as the executors run
        [str(python), "-c", "import pyspark, pyarrow, pandas; import trimaran"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        cwd=root,
        timeout=60,
    )
    assert "No module named 'trimaran'" in found.stderr, found.stderr
    return python


# -- the standalone cluster ---------------------------------------------------------------------


class Standalone:
    """A Spark standalone master and one worker on 127.0.0.1, each in its own process group (the
    worker's executors and their Python workers are in the worker's), all killed at the end."""

    def __init__(self, root: Path) -> None:
        import pyspark

        self.root = root
        self.spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
        self.port = unused_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen[bytes]] = []
        # Not the test run's PYTHONPATH: the executors inherit the worker's environment, and must
        # find Trimaran only in what the audit ships.
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
        self.env.update(
            SPARK_HOME=str(self.spark_class.parent.parent),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(root / "logs"),
            SPARK_DAEMON_MEMORY="256m",
            SPARK_DAEMON_JAVA_OPTS=FAST_JVM,
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        )

    def _start(self, name: str, *args: str) -> Path:
        log = self.root / f"{name}.log"
        with log.open("wb") as out:
            self.processes.append(
                subprocess.Popen(
                    [str(self.spark_class), *args],
                    env=self.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        return log

    def _wait_for(self, log: Path, text: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in log.read_text(errors="replace"):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                raise AssertionError(f"{log.name}: no {text!r}:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)

    def start(self) -> Standalone:
        master = self._start(
            "master",
            *("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"),
            *("--port", str(self.port), "--webui-port", "0"),
        )
        self._wait_for(master, "I have been elected leader")
        worker = self._start(
            "worker",
            *("org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--webui-port", "0"),
            *("--cores", str(WORKER_CORES), "--memory", "1g", "--work-dir", str(self.root / "work")),
            self.url,
        )
        self._wait_for(worker, "Successfully registered with master")
        return self

    def stop(self) -> None:
        for process in reversed(self.processes):  # the worker (and its executors) first
            for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(wait)
                    # The group's other members (executors, Python workers) go with the SIGKILL.
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
                break


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime")
    cluster = Standalone(tmp_path_factory.mktemp("spark-standalone"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def audit(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``trimaran audit ARGS`` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "trimaran", "audit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", **(env or {})},
        cwd=cwd,
        timeout=timeout,
    )


def on_cluster(
    cluster: Standalone, python: Path, output: Path, *source: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    import json

    conf = [f"--conf={key}={value}" for key, value in SMALL_TABLES.items()]
    done = audit(
        *source, "--master", cluster.url, "--output", str(output), "--no-charts", *conf,
        env={"PYSPARK_PYTHON": str(python)}, cwd=output.parent,
    )  # fmt: skip
    summary_file = output / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    return done, summary


def _last_line(stderr: str) -> str:
    """The last line of stderr (Spark's progress bar rewrites its line with carriage returns)."""
    return stderr.replace("\r", "\n").strip().splitlines()[-1]


def assert_clean(done: subprocess.CompletedProcess[str], summary: dict[str, Any]) -> None:
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    failed = {k: v["examples"] for k, v in summary["invariants"].items() if not v["ok"]}
    assert failed == {}
    assert summary["counts"]["events"] > 100
    # The executors imported the replay from the zip the audit shipped (they have no Trimaran), and
    # the shuffle was sized from their cores.
    probe = next(line for line in done.stderr.replace("\r", "\n").splitlines() if "executors on " in line)
    assert "trimaran-audit.zip/trimaran/analytics/life.py" in probe, probe
    assert f"{WORKER_CORES} shuffle partitions" in probe, probe


def assert_fault(done: subprocess.CompletedProcess[str], summary: dict[str, Any], message: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr[-5000:]
    failing = {k for k, v in summary["invariants"].items() if not v["ok"]}
    assert failing == {"accounted"}, summary["invariants"]
    assert message in summary["invariants"]["accounted"]["message_ids"]
    assert f"FAIL accounted: 1 violation(s) e.g. {message}" in done.stdout


def delete_first_ack(connection: Any) -> str:
    """The fault: the first ``acked`` event of ``orders`` deleted, so that message, delivered and
    never settled, is neither acked nor pending. Returns its id (``queue:offset``)."""
    cursor = connection.cursor()
    cursor.execute(
        "SELECT id, queue, \"offset\" FROM queue_events WHERE queue = 'orders' AND kind = 'acked' "
        "ORDER BY id LIMIT 1"
    )
    event_id, queue, offset = cursor.fetchone()
    cursor.execute(f"DELETE FROM queue_events WHERE id = {int(event_id)}")
    connection.commit()
    return f"{queue}:{offset}"


def sqlite_to_parquet(database: Path, directory: Path) -> None:
    """The audited columns of each table as Parquet, one directory per table: ``trimaran export``'s
    layout, written with pyarrow (no Spark run needed to make the input)."""
    kinds = {"string": pa.string(), "bigint": pa.int64(), "int": pa.int32()}
    with closing(sqlite3.connect(database)) as db:
        for table, columns in TABLES.items():
            names = ", ".join(f'"{c}"' for c in columns)
            rows = db.execute(f"SELECT {names} FROM {table}").fetchall()
            schema = pa.schema([(c, kinds[t]) for c, t in columns.items()])
            data = pa.Table.from_pylist([dict(zip(columns, r, strict=True)) for r in rows], schema=schema)
            (directory / table).mkdir(parents=True)
            pq.write_table(data, directory / table / "part-0.parquet")


# -- no cluster needed ----------------------------------------------------------------------------


def test_bundle_is_importable_without_trimaran(tmp_path: Path, executor_python: Path) -> None:
    zipped = bundle(tmp_path)
    code = f"import sys; sys.path.insert(0, {str(zipped)!r}); import trimaran.analytics.life as m"
    code += "; print(m.__file__)"
    found = subprocess.run(
        [str(executor_python), "-c", code],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == f"{zipped}/trimaran/analytics/life.py"


def test_slice_count_spreads_large_tables_over_the_cores() -> None:
    assert slice_count(0, 8) == 1
    assert slice_count(MIN_ROWS_PER_SLICE - 1, 8) == 1  # too small to be worth a second connection
    assert slice_count(3 * MIN_ROWS_PER_SLICE, 8) == 3  # each slice keeps at least the minimum
    assert slice_count(ROWS_PER_SLICE, 8) == 8  # one slice per core
    assert slice_count(ROWS_PER_SLICE, 1) == 1
    assert slice_count(40 * ROWS_PER_SLICE, 8) == 40  # no slice much above ROWS_PER_SLICE


PROGRESS = re.compile(r"audit: (spark|read|replay|report) +.+ \(\d+\.\d s\)")


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('empty') / 'trimaran.db'}"
    subprocess.run([sys.executable, "-m", "trimaran", "db", "upgrade", "--storage", url], check=True)
    return url


def test_a_quiet_audit_prints_its_progress_and_keeps_sparks_output_in_a_log(
    empty_db: str, tmp_path: Path
) -> None:
    done = audit("--storage", empty_db, "--master", "local[1]", "--no-charts", "-o", "report", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    lines = done.stderr.splitlines()
    assert [PROGRESS.fullmatch(line) is not None for line in lines] == [True] * 4, done.stderr
    assert [line.split()[1] for line in lines] == ["spark", "read", "replay", "report"]
    assert lines[0].startswith("audit: spark  started on local[1], 1 shuffle partitions (")
    assert lines[1].startswith("audit: read   0 events of 0 queues (")
    log = (tmp_path / "report" / "spark.log").read_text()
    assert "log4j" in log  # the JVM's own start-up lines went there, not to the terminal
    assert "0 messages, 0 events replayed in" in done.stdout


@pytest.mark.slow  # a JVM's start for one flag: the quiet audit above runs by default
def test_a_verbose_audit_shows_sparks_own_output(empty_db: str, tmp_path: Path) -> None:
    options = ["--master", "local[1]", "--no-charts", "-o", "report", "--verbose"]
    done = audit("--storage", empty_db, *options, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    lines = done.stderr.replace("\r", "\n").splitlines()
    ours = [line for line in lines if PROGRESS.fullmatch(line)]
    assert [line.split()[1] for line in ours] == ["spark", "read", "replay", "report"]
    assert "log4j" in done.stderr and len(lines) > len(ours)
    assert not (tmp_path / "report" / "spark.log").exists()


@pytest.mark.parametrize("how", ["flag", "environment", "trimaran.toml"])
def test_unreachable_master_is_one_line_and_exit_2(how: str, tmp_path: Path) -> None:
    master = f"spark://127.0.0.1:{unused_port()}"  # nothing listens there
    args = ["--parquet", str(tmp_path / "export")]
    env = {}
    if how == "flag":
        args += ["--master", master]
    elif how == "environment":
        env["TRIMARAN_AUDIT__MASTER"] = master
    else:
        (tmp_path / "trimaran.toml").write_text(f'[audit]\nmaster = "{master}"\n')
    started = time.monotonic()
    done = audit(*args, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"trimaran audit: cannot reach the Spark master {master} ({master[8:]}: Connection refused)"
    ]
    assert time.monotonic() - started < 30  # no JVM was started


def test_missing_jdbc_jar_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = audit("--storage", "sqlite:///x.db", "--jars", str(tmp_path / "nope.jar"), cwd=tmp_path)
    assert (done.returncode, done.stderr) == (2, f"trimaran audit: JDBC jar not found: {tmp_path}/nope.jar\n")
    sqlite_jar = "/usr/share/java/sqlite-jdbc.jar"
    if not Path(sqlite_jar).exists():
        return
    done = audit("--storage", "postgresql://audit@db/trimaran", "--jars", sqlite_jar, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        f"trimaran audit: no JDBC jar holds org.postgresql.Driver (looked in: {sqlite_jar}); "
        "pass --jars PATH or install Debian's libpostgresql-jdbc-java\n"
    )


@pytest.mark.parametrize("source", ["parquet", "postgresql"])
def test_spark_errors_are_one_line_and_exit_2(
    source: str, spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What Spark raises while reading (here in local mode, with the tests' session) is one line."""
    parser = argparse.ArgumentParser()
    add_arguments(parser, master_default="local[2]")
    if source == "parquet":
        args = parser.parse_args(["--parquet", str(tmp_path / "no-export"), "-o", str(tmp_path / "r")])
        code = run_audit(args, None, spark=spark)
        expected = f"Path does not exist: file:{tmp_path}/no-export/"
    else:
        args = parser.parse_args(["-o", str(tmp_path / "r")])
        port = unused_port()
        code = run_audit(args, f"postgresql://audit@127.0.0.1:{port}/trimaran", spark=spark)
        expected = "Couldn't connect to the database (ConnectException: Connection refused)"
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith("trimaran audit: ") and expected in err, err


# -- on the cluster -----------------------------------------------------------------------------


@pytest.mark.slow
def test_parquet_on_the_cluster(
    standalone: Standalone, executor_python: Path, broker_db: str, tmp_path: Path
) -> None:
    database, _ = _copied(broker_db, tmp_path)
    sqlite_to_parquet(database, tmp_path / "clean")
    assert_clean(
        *on_cluster(
            standalone, executor_python, tmp_path / "report-clean", "--parquet", str(tmp_path / "clean")
        )
    )

    with closing(sqlite3.connect(database)) as db:
        message = delete_first_ack(db)
    sqlite_to_parquet(database, tmp_path / "faulty")
    done, summary = on_cluster(
        standalone, executor_python, tmp_path / "report-faulty", "--parquet", str(tmp_path / "faulty")
    )
    assert_fault(done, summary, message)


# The cluster's start and an audit on it (about 37 s). By default, the pieces: the bundle the audit
# ships imports the replay in an executor's Python without Trimaran (test_bundle_is_importable_...),
# and the same audit of SQLite over JDBC runs in local mode, in process (test_replay.py,
# test_lifecycle.py, the crash series) and as `trimaran audit` (test_a_quiet_audit_...).
@pytest.mark.slow
def test_sqlite_on_the_cluster(
    standalone: Standalone, executor_python: Path, broker_db: str, tmp_path: Path
) -> None:
    _, url = _copied(broker_db, tmp_path)
    assert_clean(*on_cluster(standalone, executor_python, tmp_path / "report-clean", "--storage", url))


def _copied(broker_db: str, tmp_path: Path) -> tuple[Path, str]:
    """A copy of the broker's SQLite database to audit (or to break), and its URL."""
    database = tmp_path / "trimaran.db"
    shutil.copy(broker_db.removeprefix("sqlite:///"), database)
    return database, f"sqlite:///{database}"


# A second audit on the cluster (about 20 s) for the verdict on a fault: the same replay finds the
# same fault in local mode by default (test_replay.py, test_lifecycle.py).
@pytest.mark.slow
def test_a_fault_in_sqlite_fails_on_the_cluster(
    standalone: Standalone, executor_python: Path, broker_db: str, tmp_path: Path
) -> None:
    database, url = _copied(broker_db, tmp_path)
    with closing(sqlite3.connect(database)) as db:
        message = delete_first_ack(db)
    done, summary = on_cluster(standalone, executor_python, tmp_path / "report-faulty", "--storage", url)
    assert_fault(done, summary, message)


# The read-only role the README documents: the audit needs nothing but SELECT on five tables.
READ_ONLY_ROLE = """
CREATE ROLE trimaran_audit LOGIN;
GRANT CONNECT ON DATABASE {database} TO trimaran_audit;
GRANT USAGE ON SCHEMA public TO trimaran_audit;
GRANT SELECT ON queues, queue_messages, queue_groups, queue_pending, queue_events TO trimaran_audit;
ALTER ROLE trimaran_audit SET default_transaction_read_only = on;
"""


@pytest.mark.slow
@pytest.mark.postgres
def test_postgresql_on_the_cluster(
    standalone: Standalone,
    executor_python: Path,
    postgres_cluster: PostgresCluster,
    tls_files: dict[str, str],
    tmp_path: Path,
) -> None:
    import psycopg

    owner_url = postgres_cluster.create_database("audit_cluster")
    (tmp_path / "broker").mkdir()
    write_broker_tables(tmp_path / "broker", owner_url, tls_files)
    with psycopg.connect(owner_url) as db:
        db.execute(READ_ONLY_ROLE.format(database="audit_cluster"))  # type: ignore[arg-type]
    reader_url = owner_url.replace("postgres@", "trimaran_audit@")
    assert_clean(*on_cluster(standalone, executor_python, tmp_path / "report-clean", "--storage", reader_url))

    with psycopg.connect(owner_url) as db:
        message = delete_first_ack(db)
    done, summary = on_cluster(
        standalone, executor_python, tmp_path / "report-faulty", "--storage", reader_url
    )
    assert_fault(done, summary, message)


@pytest.mark.slow
def test_no_executor_is_one_line_and_exit_2(
    standalone: Standalone, executor_python: Path, tmp_path: Path
) -> None:
    """Executors bigger than the worker never start: the audit says so after
    ``audit.executor_timeout_s`` instead of waiting for ever."""
    started = time.monotonic()
    done = audit(
        "--parquet", str(tmp_path / "none"), "--master", standalone.url, "--conf", "spark.executor.memory=4g",
        env={"PYSPARK_PYTHON": str(executor_python), "TRIMARAN_AUDIT__EXECUTOR_TIMEOUT_S": "3"}, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr[-5000:]
    assert _last_line(done.stderr) == (
        f"trimaran audit: no executor ran a task within 3 s on {standalone.url}: are workers up, with "
        "enough free cores and memory for spark.executor.cores / spark.executor.memory?"
    )
    assert "Traceback" not in done.stderr
    assert time.monotonic() - started < 60


@pytest.mark.slow  # a venv and an executor's start: test_spark_errors_are_one_line covers the path
def test_executors_that_cannot_import_pyarrow_are_one_line_and_exit_2(
    standalone: Standalone, tmp_path: Path
) -> None:
    bare = executor_venv(tmp_path / "bare", packages=())  # pyspark comes from the worker's zip only
    done, _ = on_cluster(standalone, bare, tmp_path / "report", "--parquet", str(tmp_path / "none"))
    assert done.returncode == 2, done.stdout + done.stderr[-5000:]
    assert done.stdout == ""
    line = _last_line(done.stderr)
    assert line.startswith(f"trimaran audit: the executors' Python (3.{sys.version_info[1]}."), line
    assert "cannot import pyarrow: ModuleNotFoundError: No module named 'pyarrow'" in line
    assert "Traceback" not in done.stderr
    assert "\tat org.apache" not in done.stderr
