"""``trimaran/storage`` stores rows and JSON for every hull and knows none of them (DESIGN.md, the
target layout: imports go down only, hulls > queue > storage)."""

from __future__ import annotations

import pytest

from tests.test_sansio_imports import PACKAGE, imported_modules

HULLS = ("trimaran.mqtt", "trimaran.amqp091", "trimaran.amqp1")
STORAGE = sorted(str(path.relative_to(PACKAGE)) for path in (PACKAGE / "storage").rglob("*.py"))


def test_storage_modules_are_found() -> None:
    assert "storage/amqp_store.py" in STORAGE and "storage/writer.py" in STORAGE


@pytest.mark.parametrize("relative", STORAGE)
def test_storage_imports_no_protocol(relative: str) -> None:
    offending = sorted(
        m for m in imported_modules(PACKAGE / relative) if any(m == h or m.startswith(h + ".") for h in HULLS)
    )
    assert not offending, f"{relative} imports {offending}"
