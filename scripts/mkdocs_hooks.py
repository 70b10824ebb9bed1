"""MkDocs hook (mkdocs.yml `hooks:`): adds the manual's generated pages at every build.

The configuration, the admin API and the changelog are made by ``trimaran/manual.py`` from the code and
from CHANGELOG.md, so the built manual cannot drift from them and nothing generated is committed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

from trimaran.manual import generated_pages


def on_files(files: Files, config: Any) -> Files:
    root = Path(config.config_file_path).resolve().parent
    for path, text in generated_pages(root).items():
        files.append(File.generated(config, path, content=text))
    return files
