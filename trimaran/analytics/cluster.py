"""Where the audit's Spark runs: one session setup for a local master and for a cluster.

In local mode (``local``, ``local[N]``, ``local[*]``) the executors are Python processes forked on
this machine with this interpreter, so they import Trimaran as the driver does. On a cluster
(``spark://``, ``yarn``, ``k8s://``) the executors run whatever Python the cluster gives them
(``PYSPARK_PYTHON`` / ``spark.pyspark.python``), which has pyspark, pyarrow and pandas but not
Trimaran. So, once per run, the installed ``trimaran`` package (wherever it was imported from: a
wheel in site-packages or a checkout) is zipped and added with ``addPyFile``; the JDBC jars travel as
``spark.jars``; a one-task probe checks that the executors can import what the replay needs before
any data is read; and the shuffle partitions are sized from the executors' cores.

Anything that keeps the audit from running (an unreachable master, a missing JDBC jar, executors
that cannot import the code, no executor at all) becomes :class:`CannotRun`: one line for the user,
exit status 2, never a page of Java and Python tracebacks.

Spark's own output (the JVM's start-up warnings, log4j lines, stage progress bars) is not the
audit's: unless ``verbose``, the JVM started for the audit writes its stderr to ``Launch.log_file``
(``<report>/spark.log``) and draws no progress bars, and the audit prints its own progress instead.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import tempfile
import threading
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from trimaran.analytics.source import spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# What the executors import: the replay's rules, and the two libraries mapInArrow needs.
EXECUTOR_IMPORTS = ("pyarrow", "pandas", "trimaran.analytics.life")
# URL scheme -> (JDBC driver class, the Debian package with its jar)
JDBC_DRIVERS = {
    "sqlite": ("org.sqlite.JDBC", "libxerial-sqlite-jdbc-java"),
    "postgresql": ("org.postgresql.Driver", "libpostgresql-jdbc-java"),
    "postgres": ("org.postgresql.Driver", "libpostgresql-jdbc-java"),
}
PROBE_GROUP = "trimaran-audit-probe"
CLASSPATH_SETTINGS = ("spark.jars", "spark.jars.packages", "spark.driver.extraClassPath")


class CannotRun(Exception):
    """The audit could not run; the message is one line that says why and what to do."""


@dataclass
class Launch:
    """How to start Spark for one audit run (from the command line over ``[audit]`` settings)."""

    master: str | None  # None: what spark-submit configured
    jars: list[str] | None = None  # None: add none (spark-submit --jars, or the cluster's classpath)
    jars_given: bool = False  # named by the user (else the defaults: only those present are passed)
    conf: dict[str, str] = field(default_factory=dict)
    shuffle_partitions: int | None = None  # None: the executors' cores
    executor_timeout_s: float = 180.0
    app_name: str = "trimaran-audit"
    verbose: bool = False  # Spark's own log and progress bars on the terminal
    log_file: Path | None = None  # unless verbose: where the JVM's stderr goes (None: the terminal)


def _stderr_to(path: Path) -> AbstractContextManager[None]:
    """File descriptor 2 pointed at ``path`` while the JVM starts: the JVM (and the Python workers
    it forks) inherit it and keep writing there; this process gets its terminal back at once."""

    @contextmanager
    def redirected() -> Iterator[None]:
        path.parent.mkdir(parents=True, exist_ok=True)
        saved = os.dup(2)
        try:
            with open(path, "ab") as target:
                os.dup2(target.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)

    return redirected()


def is_local(master: str | None) -> bool:
    return master is not None and (master == "local" or master.startswith("local["))


def parse_conf(pairs: list[str] | None) -> dict[str, str]:
    """``--conf KEY=VALUE`` flags as a dict."""
    conf = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CannotRun(f"--conf {pair!r}: expected KEY=VALUE, e.g. spark.executor.memory=4g")
        conf[key.strip()] = value
    return conf


# -- checks made before any JVM starts ---------------------------------------------------------


def master_addresses(master: str) -> list[tuple[str, int]]:
    """The host:port pairs of a ``spark://`` master URL (several for a standby-master setup)."""
    addresses = []
    for part in master.removeprefix("spark://").split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep:
            host, port = port, "7077"
        if not port.isdigit():
            raise CannotRun(f"Spark master {master!r}: expected spark://HOST:PORT")
        addresses.append((host.strip("[]"), int(port)))
    return addresses


def check_master(master: str | None, timeout_s: float = 5.0) -> None:
    """A standalone master that answers no TCP connection would leave Spark retrying for a minute."""
    if master is None or not master.startswith("spark://"):
        return
    errors = []
    for host, port in master_addresses(master):
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return
        except OSError as exc:
            errors.append(f"{host}:{port}: {exc.strerror or exc}")
    raise CannotRun(f"cannot reach the Spark master {master} ({'; '.join(errors)})")


def jar_has_class(jar: str, class_name: str) -> bool:
    try:
        with zipfile.ZipFile(jar) as archive:
            names = set(archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False
    return class_name.replace(".", "/") + ".class" in names


def check_jars(jars: list[str], *, given: bool, storage_url: str | None) -> list[str]:
    """The jars to pass: each one the user named must exist, and one must hold the storage's driver.

    ``given``: the user named them, so a missing one is an error; otherwise they are the defaults
    (Debian's), of which those present are passed.
    """
    missing = [j for j in jars if not Path(j).is_file()]
    if given and missing:
        raise CannotRun(f"JDBC jar not found: {', '.join(missing)}")
    present = [j for j in jars if j not in missing]
    scheme = urlsplit(storage_url).scheme.split("+", 1)[0] if storage_url else ""
    driver, package = JDBC_DRIVERS.get(scheme, (None, None))
    if driver is not None and not any(jar_has_class(j, driver) for j in present):
        raise CannotRun(
            f"no JDBC jar holds {driver} (looked in: {', '.join(jars) or 'none'}); "
            f"pass --jars PATH or install Debian's {package}"
        )
    return present


# -- what the executors get ----------------------------------------------------------------------


def bundle(directory: Path) -> Path:
    """Zip the ``trimaran`` package this process imported (its Python files) for the executors."""
    import trimaran

    root = Path(trimaran.__file__).resolve().parent
    target = directory / "trimaran-audit.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" not in path.parts:
                archive.write(path, (Path("trimaran") / path.relative_to(root)).as_posix())
    return target


def probe_executors(spark: SparkSession, timeout_s: float) -> dict[str, str]:
    """Run one task that imports what the replay needs; returns what the executor found.

    The task function is defined here, inside, so that it travels by value: it must run even where
    ``trimaran`` cannot be imported, to say so.
    """

    def probe(_: Iterable[int]) -> Iterator[tuple[str, str]]:
        import importlib
        import sys

        yield "python", "{}.{}.{} ({})".format(*sys.version_info[:3], sys.executable)
        for name in EXECUTOR_IMPORTS:
            try:
                module = importlib.import_module(name)
            except Exception as exc:
                yield name, f"! {type(exc).__name__}: {exc}"
            else:
                yield name, str(getattr(module, "__version__", None) or getattr(module, "__file__", "ok"))

    sc = spark.sparkContext
    outcome: dict[str, Any] = {}

    def run() -> None:
        sc.setJobGroup(PROBE_GROUP, "trimaran audit: can the executors import the replay?", True)
        try:
            outcome["found"] = dict(sc.parallelize([0], 1).mapPartitions(probe).collect())
        except BaseException as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="trimaran-audit-probe", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        sc.cancelJobGroup(PROBE_GROUP)
        worker.join(10)
        raise CannotRun(
            f"no executor ran a task within {timeout_s:.0f} s on {sc.master}: are workers up, with "
            "enough free cores and memory for spark.executor.cores / spark.executor.memory?"
        )
    if "error" in outcome:
        raise CannotRun(f"the executors could not run a task: {explain(outcome['error'])}")
    found: dict[str, str] = outcome["found"]
    broken = {name: text[2:] for name, text in found.items() if text.startswith("! ")}
    if broken:
        what = "; ".join(f"{name}: {text}" for name, text in broken.items())
        raise CannotRun(
            f"the executors' Python ({found.get('python', '?')}) cannot import {what} "
            "(it needs pyspark, pyarrow and pandas; set PYSPARK_PYTHON or spark.pyspark.python)"
        )
    return found


# -- errors --------------------------------------------------------------------------------------

_PYTHON_ERROR = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.*)$", re.MULTILINE)
_JAVA_PACKAGE = re.compile(r"\b(?:[a-z]\w*\.)+(?=[A-Z]\w*(?:Exception|Error)\b)")


def spark_errors() -> tuple[type[BaseException], ...]:
    """The exception types through which Spark reports that it could not do the work."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    return (Py4JError, PySparkException)


def _root_cause(exc: BaseException) -> str | None:
    """The innermost Java cause (e.g. the JDBC driver's own message), while the JVM is up."""
    from py4j.protocol import Py4JError

    # Py4JJavaError keeps the Java exception public; PySpark's converted ones keep it as _origin.
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    if java is None:
        return None
    try:
        for _ in range(20):
            cause = java.getCause()
            if cause is None:
                break
            java = cause
        return str(java.toString())
    except Py4JError:
        return None


def explain(exc: BaseException) -> str:
    """One line from a Spark failure: an executor's Python error, else Spark's message with the root
    Java cause."""
    text = str(exc)
    if "Traceback (most recent call last)" in text:
        tail = text.split("Traceback (most recent call last)", 1)[1]
        python = _PYTHON_ERROR.search(tail)
        if python is not None:
            return f"{python.group(1).rpartition('.')[2]}: {python.group(2).strip()}"
    missing = re.search(r"ClassNotFoundException: ([\w.$]+)", text)
    if missing is not None:
        return f"Java class {missing.group(1)} not found: is its jar in --jars (spark.jars)?"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # Py4J: "An error occurred while calling o42.load.\n: java.sql.SQLException: ..."
    top = next((x.lstrip(": ") for x in lines if not x.startswith("An error occurred while calling")), "")
    top = _JAVA_PACKAGE.sub("", re.sub(r"\s*SQLSTATE: \w+$", "", top)) or type(exc).__name__
    root = _JAVA_PACKAGE.sub("", re.sub(r"\s*SQLSTATE: \w+$", "", (_root_cause(exc) or "").split("\n")[0]))
    said = root.partition(": ")[2] or root  # the cause's message without its class name
    line = f"{top} ({root})" if root and said not in top else top
    return line if len(line) <= 500 else line[:497] + "..."


# -- the session ---------------------------------------------------------------------------------


@contextmanager
def audit_session(launch: Launch, *, storage_url: str | None) -> Iterator[SparkSession]:
    """A SparkSession ready for the replay, stopped at the end; raises :class:`CannotRun`.

    ``storage_url``: the database the audit reads over JDBC (None for a Parquet export).
    """
    check_master(launch.master)
    jars = launch.jars
    if jars is not None:
        # A driver supplied through Spark settings (a Maven package, the classpath) is not looked for.
        supplied = any(key in launch.conf for key in CLASSPATH_SETTINGS)
        jars = check_jars(jars, given=launch.jars_given, storage_url=None if supplied else storage_url)
    quiet = not launch.verbose
    log_file = launch.log_file if quiet else None
    conf = {"spark.ui.showConsoleProgress": "false" if quiet else "true", **launch.conf}
    with tempfile.TemporaryDirectory(prefix="trimaran-audit-") as work:
        try:
            with _stderr_to(log_file) if log_file is not None else nullcontext():
                spark = spark_session(launch.master, jars, app_name=launch.app_name, extra=conf)
        except spark_errors() as exc:
            where = launch.master or "spark-submit's master"
            told = f" (Spark's log: {log_file})" if log_file is not None else ""
            raise CannotRun(f"Spark did not start on {where}: {explain(exc)}{told}") from exc
        try:
            sc = spark.sparkContext
            # Spark's warnings carry Java stack traces (a missing path, a lost task): the audit says
            # what went wrong in one line. They are kept in the log file, and shown with --verbose
            # or --log-level debug.
            shown = launch.verbose or log_file is not None or log.isEnabledFor(logging.DEBUG)
            sc.setLogLevel("WARN" if shown else "ERROR")
            found = None
            if not is_local(sc.master):
                sc.addPyFile(str(bundle(Path(work))))
                found = probe_executors(spark, launch.executor_timeout_s)
            # One shuffle partition per core (local: this machine's; a cluster: the executors'
            # registered when the probe ran, or spark.default.parallelism when set).
            partitions = launch.shuffle_partitions or max(1, sc.defaultParallelism)
            spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
            if found is not None:
                seen = ", ".join(f"{name} {value}" for name, value in found.items())
                log.info("executors on %s: %d shuffle partitions; %s", sc.master, partitions, seen)
            yield spark
        except spark_errors() as exc:
            log.debug("the audit could not run", exc_info=exc)
            raise CannotRun(explain(exc)) from exc  # while the JVM is up to tell the root cause
        finally:
            spark.stop()
