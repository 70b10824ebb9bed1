"""The manual (docs/, mkdocs.yml) and its generated pages (trimaran/manual.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from trimaran import manual

ROOT = Path(__file__).resolve().parents[1]


def test_every_setting_has_a_description() -> None:
    assert manual.undescribed_keys() == [], "add a Field(description=...) in trimaran/config.py"


def test_configuration_page_lists_every_key_with_its_variable() -> None:
    page = manual.configuration_page()
    keys = list(manual.settings_keys())
    assert len(keys) > 100
    for key in keys:
        assert f"`{'.'.join(key.path).replace('[]', '[n]')}`" in page
        if key.env is not None:
            assert f"`{key.env}`" in page
    assert "`TRIMARAN_LIMITS__MAX_CONNECTIONS`" in page
    assert "| `limits.max_connections` | integer, >= 1 | `100_000` |" in page
    assert '| `listeners.mqtt` | address or `off` | `"0.0.0.0:1883"` |' in page


def test_admin_api_page_is_the_servers_openapi_document() -> None:
    document = manual.openapi()
    page = manual.admin_api_page(document)
    for path, operations in document["paths"].items():
        for method in operations:
            assert f"### `{method.upper()} {path}`" in page
    for name in document["components"]["schemas"]:
        assert f"### {name} " in page


def _nav_pages(nav: list[object]) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [str(value)]
    return pages


def test_nav_names_every_page() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    in_nav = _nav_pages(config["nav"])
    written = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert sorted(in_nav) == sorted(written)


def test_committed_generated_pages_are_what_the_code_makes() -> None:
    """docs/configuration.md, admin-api.md, openapi.json and changelog.md are committed so that a
    reader of the repository finds them: they must be exactly what the code makes."""
    assert manual.stale_pages(ROOT) == [], "stale generated pages: run make manual"
    for path in manual.generated_pages(ROOT):
        assert (ROOT / "docs" / path).is_file()


def test_a_stale_page_is_named_and_written_again(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "CHANGELOG.md").write_text("# Changelog\n\n## [Unreleased]\n")
    assert manual.stale_pages(tmp_path) == sorted(manual.generated_pages(tmp_path))
    assert manual.write_pages(tmp_path) == sorted(manual.generated_pages(tmp_path))
    assert manual.stale_pages(tmp_path) == []
    (tmp_path / "docs" / "configuration.md").write_text("# Configuration\n\nedited by hand\n")
    assert manual.stale_pages(tmp_path) == ["configuration.md"]
    checked = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "manual_pages.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr  # this checkout's pages are fresh


def test_the_configuration_page_types_tables_of_tables() -> None:
    page = manual.configuration_page()
    assert (
        "| `limits.vhosts` | table of tables, one per name, each with `max_connections`, `max_queues`, "
        "`max_stored_bytes` |"
    ) in page
    assert "| `limits.users` | table of tables, one per name, each with `max_connections`, " in page
    assert "| `auth.vhost_map` | table of strings |" in page


def test_manual_builds_strict(tmp_path: Path) -> None:
    """A broken link or anchor, or a page left out of the nav, fails the build (mkdocs.yml: validation)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    site = tmp_path / "site"
    assert "TRIMARAN_STORAGE__URL" in (site / "configuration" / "index.html").read_text()
    assert "/api/v1/queues/{name}/purge" in (site / "admin-api" / "index.html").read_text()
    assert "## [Unreleased]" not in (site / "changelog" / "index.html").read_text()  # rendered, not raw
    assert (site / "openapi.json").is_file()
