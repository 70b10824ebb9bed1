"""trimaran/compiled.py: which build of the hot modules runs, the source as the fallback, and the
start log line that says which. CI runs these twice: interpreted (``make test``) and compiled
(``make test-compiled``, which sets TRIMARAN_REQUIRE_COMPILED)."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Any

import pytest

import trimaran
from tests.support.server import ALL_OFF, RunningServer, serving
from trimaran import compiled
from trimaran.broker.message import Message
from trimaran.compiled import ENV, MODULES

# The package under test: the checkout, or an installed wheel (scripts/wheel_suites.py).
ROOT = Path(trimaran.__file__).resolve().parent.parent
PROBE = (
    "import json, sys; from trimaran import compiled; "
    "print(json.dumps([compiled.describe(), [sys.modules[n].__file__ for n in compiled.MODULES]]))"
)


def source_of(name: str) -> Path:
    return ROOT.joinpath(*name.split(".")).with_suffix(".py")


def built(name: str) -> bool:
    source = source_of(name)
    return any(source.parent.glob(source.stem + ".*.so"))


def probe(interpreted: str | None) -> tuple[str, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if interpreted is not None:
        env[ENV] = interpreted
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True, timeout=60
    )
    described, files = json.loads(done.stdout)
    return described, files


def test_every_listed_module_is_a_source_file_of_the_package() -> None:
    assert len(set(MODULES)) == len(MODULES)
    for name in MODULES:
        assert source_of(name).is_file(), name


def test_the_variable_runs_the_source_even_where_the_modules_are_built() -> None:
    described, files = probe("1")
    assert described == f"interpreted ({ENV} set)"
    assert files == [str(source_of(name)) for name in MODULES]


def test_without_the_variable_the_build_in_place_runs_if_there_is_a_whole_one() -> None:
    whole = compiled.why_interpreted() is None or os.environ.get(ENV) is not None
    for interpreted in (None, "0"):
        described, files = probe(interpreted)
        if whole and built(MODULES[0]):
            assert described == "compiled (mypyc)"
            assert all(file.endswith(".so") for file in files)
        else:
            assert described.startswith("interpreted")
            assert all(file.endswith(".py") for file in files)


def test_the_compiled_run_runs_compiled() -> None:
    """So that ``make test-compiled`` cannot pass on the source without saying so."""
    if not os.environ.get("TRIMARAN_REQUIRE_COMPILED"):
        pytest.skip("TRIMARAN_REQUIRE_COMPILED unset: the interpreted run")
    assert compiled.compiled_modules() == list(MODULES)
    assert compiled.describe() == "compiled (mypyc)"


def test_the_start_log_says_which_build_runs(tmp_path: Path) -> None:
    server = RunningServer(ALL_OFF, cwd=tmp_path, env={ENV: "1"})
    with serving(server.start()) as running:
        assert f"protocol machines: interpreted ({ENV} set)" in running.output()


def test_the_version_command_says_which_build_runs() -> None:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    for variable, build in (
        ({}, "compiled" if compiled.why_interpreted() is None else "source"),
        ({ENV: "1"}, "source"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "trimaran", "version"],
            env={**env, **variable},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        release, said = done.stdout.splitlines()
        assert release == f"trimaran {trimaran.__version__}"
        assert said.startswith(f"build: {build}, protocol machines "), said


def why_in(package_root: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", "from trimaran import compiled; print(compiled.why_interpreted())"],
        env={**{k: v for k, v in os.environ.items() if k != ENV}, "PYTHONPATH": str(package_root)},
        cwd=package_root,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout.strip()


def test_a_partial_or_stale_build_runs_the_source(tmp_path: Path) -> None:
    """All or nothing, and never older than the source: checked on a copy of the package with
    stand-ins for the extensions (never loaded: the check runs before any hot module is imported)."""
    copy = tmp_path / "trimaran"
    shutil.copytree(ROOT / "trimaran", copy, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    assert why_in(tmp_path) == "no build"

    suffix = EXTENSION_SUFFIXES[0]
    library = copy / ("_mypyc__mypyc" + suffix)
    library.touch()
    for name in MODULES:
        tmp_path.joinpath(*name.split(".")).with_suffix(suffix).touch()
    assert why_in(tmp_path) == "None"

    codec = copy / "mqtt" / ("codec" + suffix)
    codec.unlink()
    assert why_in(tmp_path) == "the build lacks trimaran/mqtt/codec.py: make compile"
    codec.touch()

    later = library.stat().st_mtime + 10
    os.utime(copy / "amqp1" / "handler.py", (later, later))
    assert why_in(tmp_path) == "the build is older than trimaran/amqp1/handler.py: make compile"

    # Installed from a wheel (its dist-info beside the package), the installer wrote every file in
    # the wheel's order: a source written after the library is not an edit.
    (tmp_path / "trimaran-0.1.0.dist-info").mkdir()
    assert why_in(tmp_path) == "None"


def test_no_compiled_function_binds_one_exception_name_to_two_types() -> None:
    """Compiled, a local has one type: ``except A as exc`` then ``except B as exc`` in one function
    makes the second a TypeError at run time (when A is a native class), which would turn a refusal
    into a dropped connection. The source must give each its own name."""
    clashes = []
    for name in MODULES:
        tree = ast.parse(source_of(name).read_text())
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            bound: dict[str, set[str]] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.ExceptHandler) and node.name and node.type is not None:
                    bound.setdefault(node.name, set()).add(ast.unparse(node.type))
            clashes += [f"{name}.{function.name}: {n} {sorted(t)}" for n, t in bound.items() if len(t) > 1]
    assert clashes == []


def _written_out_samples() -> list[tuple[type, tuple[object, ...]]]:
    """A value for every field, in field order, of the dataclasses that write their __init__ out
    (so that mypyc compiles it) but are not tested so elsewhere."""
    from trimaran.amqp091.events import ContentReceived, MethodReceived
    from trimaran.amqp091.properties import BasicProperties
    from trimaran.amqp091.spec import BasicAck, BasicPublish
    from trimaran.mqtt.packets import Publish, PublishRun
    from trimaran.mqtt.properties import PROPERTY_TABLE, DataType, Properties
    from trimaran.queue.groups import Entry, QueueDelivery, StoredMessage

    # A value of its type for each property (compiled, a field's type reads as type: the table
    # says it), told apart by its position.
    kinds = {p.name: p.data_type for p in PROPERTY_TABLE}
    lists: dict[str, object] = {"subscription_identifiers": [7], "user_properties": [("k", "v")]}
    props = tuple(
        lists.get(f.name, {DataType.UTF8: f"s{i}", DataType.BINARY: bytes([i])}.get(kinds[f.name], i))
        for i, f in enumerate(dataclasses.fields(Properties))
    )
    message = Message("t", b"p")
    return [
        (StoredMessage, (4, message, "rk", 1000, None, 1)),
        (Entry, ("delivered", 2, None, "c1", 10, 20, "nack", 3, 1, 1, False)),
        (QueueDelivery, (message, "q", 4, "g", 2, True, 1)),
        (ContentReceived, (3, BasicPublish(routing_key="rk"), BasicProperties(), b"body", b"\x00")),
        (MethodReceived, (3, BasicAck(5, True))),
        (Publish, ("t", b"p", 1, True, True, 9, Properties(topic_alias=2), b"wire")),
        (
            PublishRun,
            (
                "t",
                b"wire",
                2,
                5,
                3,
                True,
                1,
                ["t", "u"],
                bytearray(b"\x00\x01\x00\x02"),
                {(True, ()): (b"x", 1)},
                [(b"w", b"")],
            ),
        ),
        (Properties, props),
    ]


@pytest.mark.parametrize(("cls", "values"), _written_out_samples(), ids=lambda v: getattr(v, "__name__", ""))
def test_a_written_out_init_takes_the_fields_in_order_with_their_defaults(
    cls: type, values: tuple[object, ...]
) -> None:
    fields = dataclasses.fields(cls)
    built = cls(*values)
    assert [getattr(built, f.name) for f in fields] == list(values)
    assert built == cls(**{f.name: v for f, v in zip(fields, values, strict=True)})
    missing = dataclasses.MISSING
    required = [v for f, v in zip(fields, values, strict=True) if f.default is f.default_factory is missing]
    a, b = cls(*required), cls(*required)
    for f in fields[len(required) :]:
        factory: Any = f.default_factory
        default = factory() if f.default is dataclasses.MISSING else f.default
        assert getattr(a, f.name) == default
        if f.default is dataclasses.MISSING:  # a new value each time, as default_factory makes
            assert getattr(a, f.name) is not getattr(b, f.name)
