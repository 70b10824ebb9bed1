"""Write the manual's generated pages under docs/ (`make manual`), or with --check say which differ
from what the code makes (exit status 1), as tests/test_manual.py does.

The configuration page comes from trimaran/config.py, the admin API page and openapi.json from the
route table in trimaran/admin/api.py, the changelog page from CHANGELOG.md (trimaran/manual.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's trimaran, whatever the interpreter has installed

from trimaran.manual import stale_pages, write_pages  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is stale")
    args = parser.parse_args()
    if args.check:
        stale = stale_pages(ROOT)
        for path in stale:
            print(f"docs/{path} differs from what the code makes: run make manual", file=sys.stderr)
        return 1 if stale else 0
    for path in write_pages(ROOT):
        print(f"wrote docs/{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
