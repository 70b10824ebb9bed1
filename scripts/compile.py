"""Build the hot modules (trimaran/compiled.py MODULES) with mypyc, in place: ``make compile``.

Each extension lands beside its ``.py`` file, with the one shared library they call each other
through (trimaran/_mypyc__mypyc*.so); the generated C and the objects go to build/mypyc/. The
build is scripts/mypyc_build.py's, the one the wheel's setup.py runs too; here it is a build of the
checkout, not of a distribution.

``--if-possible`` is ``make run``'s step: it builds only when no current build is there, and where
there is no C compiler, no Python headers, no mypyc or the build fails, it says so in one line and
leaves the source to run (the fallback), exiting 0. TRIMARAN_INTERPRETED=1 skips it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

# The build shared with setup.py, beside this file (also when this file is loaded by its path).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from mypyc_build import build_in_place, cannot_build

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "build" / "mypyc" / "compile.log"


def if_possible() -> int:
    from trimaran.compiled import ENV, forced_interpreted, why_interpreted

    if forced_interpreted():
        return 0
    why = why_interpreted()
    if why is None:
        return 0  # a current build is there
    lacking = cannot_build()
    if lacking is not None:
        print(f"compile: {lacking}, so the interpreted source runs (docs/performance.md)", flush=True)
        return 0
    print(
        f"compile: building the hot modules with mypyc ({why}; once, a few minutes; {ENV}=1 skips it)",
        flush=True,
    )
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("w") as log:
        done = subprocess.run([sys.executable, __file__], cwd=ROOT, stdout=log, stderr=log)
    if done.returncode != 0:
        # A half-built tree would be refused module by module anyway (compiled.why_interpreted);
        # remove it so that the next start tries again from clean.
        for extension in (ROOT / "trimaran").rglob("*.so"):
            extension.unlink()
        print(f"compile: the build failed (log: {LOG}), so the interpreted source runs", flush=True)
        return 0
    print("compile: done", flush=True)
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--if-possible", action="store_true", help="make run's step (see above)")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    if a.if_possible:
        sys.exit(if_possible())
    build_in_place(ROOT)


if __name__ == "__main__":
    main()
