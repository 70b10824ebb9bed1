"""MkDocs hook (mkdocs.yml `hooks:`): the build fails while a generated page is stale.

The configuration, the admin API (and its openapi.json) and the changelog pages are made by
``trimaran/manual.py`` from the code and from CHANGELOG.md, and committed under docs/ so that the
repository holds them too; ``make manual`` writes them again. A build from a checkout whose pages
differ from what its code makes stops here, naming them, so the manual cannot drift from the code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

from trimaran.manual import stale_pages


def on_pre_build(config: Any) -> None:
    root = Path(config.config_file_path).resolve().parent
    stale = stale_pages(root)
    if stale:
        names = ", ".join(f"docs/{path}" for path in stale)
        raise PluginError(f"{names}: stale, made from the code by trimaran/manual.py: run make manual")
