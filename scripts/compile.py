"""Build the hot modules (trimaran/compiled.py MODULES) with mypyc, in place: ``make compile``.

Each extension lands beside its ``.py`` file, with the one shared library they call each other
through (trimaran/_mypyc__mypyc*.so); the generated C and the objects go to build/mypyc/. The
package's pyproject.toml is not read: this is a build of the checkout, not of a distribution.

``--if-possible`` is ``make run``'s step: it builds only when no current build is there, and where
there is no C compiler, no Python headers, no mypyc or the build fails, it says so in one line and
leaves the source to run (the fallback), exiting 0. TRIMARAN_INTERPRETED=1 skips it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "build" / "mypyc" / "compile.log"


def build() -> None:
    from mypyc.build import mypycify
    from setuptools import Distribution

    from trimaran.compiled import GROUP, MODULES

    sources = [str(Path(*name.split(".")).with_suffix(".py")) for name in MODULES]
    extensions = mypycify(sources, opt_level="3", group_name=GROUP, target_dir="build/mypyc")
    dist = Distribution({"name": "trimaran-compiled", "ext_modules": extensions})
    dist.script_args = [
        "build_ext",
        "--inplace",
        "--build-temp",
        "build/mypyc/objects",
        "--build-lib",
        "build/mypyc/lib",
    ]
    dist.parse_command_line()
    dist.run_commands()


def cannot_build(cc: str | None = None, include: str | None = None) -> str | None:
    """What this machine lacks to build (with this C compiler and these headers: Python's own by
    default), or None."""
    compiler = (cc or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    headers = Path(include or sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.exists():
        return f"no Python headers ({headers}; Debian: python3-dev)"
    for module in ("mypyc", "setuptools"):
        if importlib.util.find_spec(module) is None:
            return f"no {module} in this Python (pip install -e '.[compile]')"
    return None


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
    build()


if __name__ == "__main__":
    main()
