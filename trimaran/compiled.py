"""Which build of the hot modules runs: compiled by mypyc, or interpreted from their source.

The modules in :data:`MODULES` are plain typed Python and always run as such. ``make compile`` builds
each into a C extension with mypyc (scripts/mypyc_build.py), beside its ``.py`` file, and Python's import
system then loads the extension first. Nothing else changes: the same code, the same tests, and the
source stays the fallback on a machine without a compiler (``make run`` never compiles).

Setting ``TRIMARAN_INTERPRETED=1`` loads these modules from their source even where extensions are
built: to compare the two, or to count the interpreter's calls (tests/test_budgets.py). So does a
build that lacks a module or is older than a source (:func:`why_interpreted`). Both are decided
once, when the package is first imported. The start log says which build runs (:func:`describe`).

The ground floor: imports nothing of the package.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader, ModuleSpec
from types import ModuleType
from typing import TypeVar

_C = TypeVar("_C")

try:
    # A mark for the mypyc build of :data:`MODULES` (native_class=False for a subclass of a builtin
    # type, allow_interpreted_subclasses for a base the tests and the uncompiled modules subclass).
    # mypy brings mypy_extensions; without it nothing is built, the source runs, and it means nothing.
    from mypy_extensions import mypyc_attr as mypyc_attr
except ImportError:

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_C], _C]:
        return lambda cls: cls


ENV = "TRIMARAN_INTERPRETED"
# The library the compiled modules share (scripts/mypyc_build.py): trimaran/_mypyc__mypyc*.so.
GROUP = "trimaran._mypyc"

# The modules on the hot paths (the profile of tests/test_budgets.py's loads) that mypyc accepts and
# whose tests pass compiled, built together so that calls between them are native. amqp1/types.py's
# wrappers of builtin types (UByte(int), Symbol(str) ...) are built as ordinary Python classes
# (mypyc_attr(native_class=False)): mypyc cannot make native subclasses of int or str. Left out:
# - amqp091/field_types.py: it subclasses builtin types (int, float), which mypyc does not compile
#   (amqp091/fields.py, compiled, imports its typed values from it);
# - amqp091/exchanges.py, durable.py: not on a message's path, only on declares and at start.
# security/permissions.py came in with the persistent sessions' storm: a subscription asks it four
# times (RabbitMQ's patterns for the client's own queue), a call by name into Python each.
# - storage/writer.py (its thread, locks and statements): the batch it writes and the per-row work
#   are storage/rows.py's, which is in, with queue/changes.py (a WriteBatch) and the journal.
# mqtt/queues.py (an MQTT `$queue/` message's way in and out) and queue/shared.py (a shared node's
# claims, asked at every publish) came in last: left out, they were most of the interpreted work
# left on the MQTT `$queue/` shared path.
# The runtime and the queue rooms on the hot path are in (queue/work.py and queue/stream.py with
# groups.py, whose Group they subclass: an interpreted class cannot subclass a compiled one). Where
# an annotation said less than what is passed, it was made true: uvloop's Server.sockets is a list
# (runner.serve reads it untyped), a test's stand-in Transport.write returns None.
MODULES = (
    "trimaran.topics",
    "trimaran.traffic",
    "trimaran.runtime.machine",
    "trimaran.broker.router",
    "trimaran.broker.message",
    "trimaran.broker.stats",
    "trimaran.broker.clients",
    "trimaran.broker.core",
    "trimaran.security.permissions",
    "trimaran.security.guard",
    "trimaran.mqtt.reason_codes",
    "trimaran.mqtt.properties",
    "trimaran.mqtt.packets",
    "trimaran.mqtt.session",
    "trimaran.mqtt.events",
    "trimaran.mqtt.codec",
    "trimaran.mqtt.connection",
    "trimaran.mqtt.mapping",
    "trimaran.mqtt.conn",
    "trimaran.mqtt.queues",
    "trimaran.mqtt.handler",
    "trimaran.amqp091.fields",
    "trimaran.amqp091.spec",
    "trimaran.amqp091.events",
    "trimaran.amqp091.properties",
    "trimaran.amqp091.frames",
    "trimaran.amqp091.connection",
    "trimaran.amqp091.mapping",
    "trimaran.amqp091.conn",
    "trimaran.amqp091.handler",
    "trimaran.amqp091.access",
    "trimaran.amqp091.channels",
    "trimaran.amqp091.operations",
    "trimaran.amqp1.types",
    "trimaran.amqp1.performatives",
    "trimaran.amqp1.events",
    "trimaran.amqp1.frames",
    "trimaran.amqp1.codec",
    "trimaran.amqp1.transfers",
    "trimaran.amqp1.messages",
    "trimaran.amqp1.session",
    "trimaran.amqp1.connection",
    "trimaran.amqp1.mapping",
    "trimaran.amqp1.conn",
    "trimaran.amqp1.links",
    "trimaran.amqp1.handler",
    "trimaran.broker.events",
    "trimaran.storage.rows",
    "trimaran.runtime.confirms",
    "trimaran.runtime.flow",
    "trimaran.runtime.outlet",
    "trimaran.runtime.transport",
    "trimaran.runtime.deadlines",
    "trimaran.runtime.poller",
    "trimaran.runtime.runner",
    "trimaran.queue.changes",
    "trimaran.queue.transient",
    "trimaran.queue.groups",
    "trimaran.queue.work",
    "trimaran.queue.stream",
    "trimaran.queue.handles",
    "trimaran.queue.journal",
    "trimaran.queue.shared",
    "trimaran.queue.manager",
)


class _SourceFirst:
    """A meta path finder that loads :data:`MODULES` from their ``.py`` files, ahead of the
    extensions Python's own path finder would prefer."""

    @staticmethod
    def find_spec(name: str, path: Sequence[str] | None = None, target: object = None) -> ModuleSpec | None:
        if name not in MODULES or not path:
            return None
        leaf = name.rpartition(".")[2]
        for entry in path:
            source = os.path.join(entry, leaf + ".py")
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(name, source)
        return None


def forced_interpreted() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def _source(name: str) -> str:
    return os.path.join(os.path.dirname(__file__), *name.split(".")[1:]) + ".py"


def _built(source: str) -> str | None:
    """The extension built from ``source`` (or from the group: :data:`GROUP`), if there is one."""
    for suffix in EXTENSION_SUFFIXES:
        extension = source[: -len(".py")] + suffix
        if os.path.isfile(extension):
            return extension
    return None


def installed() -> bool:
    """Whether this package was installed from a wheel (its ``*.dist-info`` is beside it), rather
    than run from a checkout or an editable install, where sources are edited and pulled."""
    site = os.path.dirname(os.path.dirname(__file__))
    try:
        return any(name.startswith("trimaran-") and name.endswith(".dist-info") for name in os.listdir(site))
    except OSError:
        return False


def why_interpreted() -> str | None:
    """Why the source runs, or None when the build runs: all of :data:`MODULES` or none. A build
    with one module missing or older than its source would mix two versions of the same classes
    (a compiled ``except`` does not catch the interpreted exception), and an edited or pulled
    source must not be shadowed by yesterday's build."""
    if forced_interpreted():
        return f"{ENV} set"
    # Each module's own extension only loads the group's library, which holds the code.
    library = _built(_source(GROUP + "__mypyc"))
    if library is None:
        return "no build"
    built_at = os.path.getmtime(library)
    package = os.path.dirname(os.path.dirname(__file__))
    # An installed wheel's files were all written by its installer, in the wheel's order: a source
    # written after the library is not newer than the build (installed(), tests/test_wheel.py).
    check_age = not installed()
    for source in map(_source, MODULES):
        if _built(source) is None:
            return f"the build lacks {os.path.relpath(source, package)}: make compile"
        if check_age and built_at < os.path.getmtime(source):
            return f"the build is older than {os.path.relpath(source, package)}: make compile"
    return None


_WHY: str | None = None


def honour_environment() -> None:
    """Called by the package's ``__init__``, before any of :data:`MODULES` is imported."""
    global _WHY
    _WHY = why_interpreted()
    if _WHY is not None and _WHY != "no build" and _SourceFirst not in sys.meta_path:
        sys.meta_path.insert(0, _SourceFirst)


def is_compiled(module: ModuleType) -> bool:
    return isinstance(getattr(module.__spec__, "loader", None), ExtensionFileLoader)


def compiled_modules() -> list[str]:
    """Those of :data:`MODULES` that run compiled in this process (importing them if need be)."""
    return [name for name in MODULES if is_compiled(importlib.import_module(name))]


_BUILD: str | None = None


def build() -> str:
    """``compiled`` when the hot modules run compiled in this process, else ``source``: the name
    ``trimaran version``, the status API and ``trimaran_build_info{build=...}`` give the build."""
    global _BUILD
    if _BUILD is None:
        _BUILD = "compiled" if compiled_modules() else "source"
    return _BUILD


def describe() -> str:
    """One phrase for the start log and ``trimaran version``."""
    if build() == "compiled":
        return "compiled (mypyc)"
    return "interpreted" if _WHY in (None, "no build") else f"interpreted ({_WHY})"
