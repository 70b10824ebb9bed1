"""Sans-IO modules (codecs, state machines, the router) import only the standard library."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "trimaran"

# Module paths, relative to the package, that must stay pure. New codecs add themselves here.
SANS_IO = [
    "broker/message.py",
    "broker/router.py",
    "broker/retained.py",
    "topics.py",
    "compiled.py",
    "vhosts.py",
    "selector.py",
    "mqtt/codec.py",
    "mqtt/packets.py",
    "mqtt/properties.py",
    "mqtt/reason_codes.py",
    "mqtt/connection.py",
    "runtime/machine.py",
    "mqtt/client.py",
    "mqtt/events.py",
    "mqtt/session.py",
    "amqp091/errors.py",
    "amqp091/spec.py",
    "amqp091/fields.py",
    "amqp091/field_types.py",
    "amqp091/properties.py",
    "amqp091/frames.py",
    "amqp091/connection.py",
    "amqp091/events.py",
    "amqp091/channel.py",
    "amqp091/exchanges.py",
    "amqp091/client.py",
    "amqp1/types.py",
    "amqp1/codec.py",
    "amqp1/performatives.py",
    "amqp1/messages.py",
    "amqp1/frames.py",
    "amqp1/client.py",
    "amqp1/sasl.py",
    "amqp1/errors.py",
    "amqp1/connection.py",
    "amqp1/events.py",
    "amqp1/session.py",
    "amqp1/transfers.py",
]
# The package root holds ``__version__`` and picks the build of the hot modules (compiled.py).
PURE_MODULES = {"trimaran"} | {"trimaran." + path.removesuffix(".py").replace("/", ".") for path in SANS_IO}


def imported_modules(path: Path, source: str | None = None) -> set[str]:
    """Every module a file imports; ``from pkg import name`` counts as ``pkg.name``. ``source``: read
    that instead of the file, as if it were the file's text (relative imports resolve from ``path``)."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    names: set[str] = set()
    package = "trimaran." + str(path.parent.relative_to(PACKAGE)).replace("/", ".")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if module.startswith("trimaran"):
                names.update(f"{module}.{alias.name}" for alias in node.names)
            else:
                names.add(module)
    return names


# Not the standard library, but a mark for the mypyc build that the source runs without: imported
# under ``try``, with a stand-in when it is absent (amqp1/types.py).
BUILD_MARKS = {"mypy_extensions"}


def is_allowed(module: str) -> bool:
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top == "__future__" or top in BUILD_MARKS:
        return True
    # ``from trimaran.mqtt.packets import Connect`` names a pure module's attribute.
    return module in PURE_MODULES or module.rsplit(".", 1)[0] in PURE_MODULES


present = [path for path in SANS_IO if (PACKAGE / path).exists()]


@pytest.mark.parametrize("relative", present or ["(none yet)"])
def test_imports_only_stdlib(relative: str) -> None:
    if not present:
        pytest.skip("no sans-IO modules yet")
    offending = sorted(m for m in imported_modules(PACKAGE / relative) if not is_allowed(m))
    assert not offending, f"{relative} imports {offending}"
