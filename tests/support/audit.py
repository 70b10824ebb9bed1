"""``trimaran audit`` (PySpark) over the tables a test left: every invariant must hold."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any


def cannot_audit() -> str | None:
    """Why ``trimaran audit`` cannot run here, or None."""
    try:
        from trimaran.analytics.source import DEBIAN_JARS
    except ImportError:
        return "the audit needs PySpark (the analytics extra)"
    if shutil.which("java") is None:
        return "the audit needs a JRE (scripts/system-deps.sh installs one)"
    missing = [j for j in DEBIAN_JARS if not Path(j).exists()]
    return f"JDBC drivers missing for the audit: {missing}" if missing else None


def audit(url: str, output: Path, where: str = "") -> dict[str, object]:
    """Run the audit over ``url``'s tables into ``output``; asserts that every invariant holds
    (``where`` goes into the failure message) and returns the summary."""
    command = [sys.executable, "-m", "trimaran", "audit", "--storage", url, "--output", str(output)]
    command += ["--no-charts", "--master", "local[2]"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ})
    summary = _held(output, f"{where}:\n{done.stdout}{done.stderr}")
    assert done.returncode == 0, done.stdout + done.stderr
    return summary


def audit_in(spark: Any, url: str, output: Path, where: str = "") -> dict[str, object]:
    """:func:`audit` in this process, with the tests' ``spark`` session (tests/conftest.py): the
    same replay and invariants without a JVM's start; asserts that every invariant holds."""
    from trimaran.analytics.replay import add_arguments, run_audit

    parser = argparse.ArgumentParser()
    add_arguments(parser, master_default="local[2]")
    args = parser.parse_args(["--output", str(output), "--no-charts"])
    code = run_audit(args, url, spark=spark)
    summary = _held(output, f"{where} (exit {code})")
    assert code == 0, f"audit {where}: exit {code}"
    return summary


def _held(output: Path, where: str) -> dict[str, object]:
    """The summary an audit wrote into ``output``, once it says every invariant held."""
    summary_file = output / "summary.json"
    assert summary_file.exists(), f"the audit did not run {where}"
    summary: dict[str, object] = json.loads(summary_file.read_text())
    invariants = summary["invariants"]
    assert isinstance(invariants, dict)
    failed = {k: v["examples"] for k, v in invariants.items() if not v["ok"]}
    assert failed == {}, f"audit {where}: {failed}"
    return summary
