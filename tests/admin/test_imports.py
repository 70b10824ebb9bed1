"""The rooms' import rules (DESIGN.md's layout): imports go down only, and app.py wires the rooms.

The admin side sees the server through trimaran/admin/view.py's protocols, never a protocol hull or
the application; the deck (broker/) knows nothing above it; the queue manager knows no hull and no
admin; storage knows no queue, hull or security; security (identity and rules) knows no protocol:
each hull maps its methods onto the rules in its own package (``amqp091/access.py``).
Every import counts, those under ``if TYPE_CHECKING:`` too: a type names a dependency.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_sansio_imports import PACKAGE, imported_modules

HULLS = ("trimaran.mqtt", "trimaran.amqp091", "trimaran.amqp1")

# room -> module prefixes it must not import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "admin": (*HULLS, "trimaran.app", "trimaran.net", "trimaran.cli", "trimaran.ctl", "trimaran.bridges"),
    "broker": (
        *HULLS,
        "trimaran.app",
        "trimaran.admin",
        "trimaran.queue",
        "trimaran.storage",
        "trimaran.security",
        "trimaran.runtime",
        "trimaran.net",
        "trimaran.analytics",
    ),
    "queue": (*HULLS, "trimaran.app", "trimaran.admin", "trimaran.net", "trimaran.runtime"),
    "storage": (
        *HULLS,
        "trimaran.app",
        "trimaran.admin",
        "trimaran.queue",
        "trimaran.security",
        "trimaran.runtime",
        "trimaran.net",
    ),
    # A bridge is one more client of the deck and the queues, wired by app.py; the admin side sees it
    # through view.py.
    "bridges": (
        "trimaran.app",
        "trimaran.admin",
        "trimaran.cli",
        "trimaran.ctl",
        "trimaran.storage",
        "trimaran.net",
        "trimaran.analytics",
    ),
    "security": (
        *HULLS,
        "trimaran.app",
        "trimaran.admin",
        "trimaran.queue",
        "trimaran.storage",
        "trimaran.runtime",
        "trimaran.net",
    ),
}


def _modules(room: str) -> list[Path]:
    return sorted((PACKAGE / room).rglob("*.py"))


def _forbidden_among(modules: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        module
        for module in modules
        if any(module == prefix or module.startswith(prefix + ".") for prefix in forbidden)
    )


@pytest.mark.parametrize(
    "relative",
    [str(path.relative_to(PACKAGE)) for room in FORBIDDEN for path in _modules(room)],
)
def test_room_imports_only_downwards(relative: str) -> None:
    room = relative.split("/")[0]
    offending = _forbidden_among(imported_modules(PACKAGE / relative), FORBIDDEN[room])
    assert not offending, f"trimaran/{relative} imports {offending}"


def test_the_rule_sees_imports_under_type_checking_and_plain_ones() -> None:
    """The view module as a careless change would leave it: the rule names both hull imports."""
    path = PACKAGE / "admin" / "view.py"
    careless = path.read_text() + (
        "\nimport trimaran.amqp1.codec\n"
        "if TYPE_CHECKING:\n"
        "    from trimaran.mqtt.handler import MqttFrontEnd\n"
    )
    assert _forbidden_among(imported_modules(path), FORBIDDEN["admin"]) == []
    assert _forbidden_among(imported_modules(path, careless), FORBIDDEN["admin"]) == [
        "trimaran.amqp1.codec",
        "trimaran.mqtt.handler.MqttFrontEnd",
    ]


def test_every_room_has_modules() -> None:
    for room in FORBIDDEN:
        assert _modules(room), f"no modules under trimaran/{room}: the rule would check nothing"
