"""Build the hot modules (trimaran/compiled.py MODULES) with mypyc, in place: ``make compile``.

Each extension lands beside its ``.py`` file, with the one shared library they call each other
through (trimaran/_mypyc__mypyc*.so); the generated C and the objects go to build/mypyc/. The
package's pyproject.toml is not read: this is a build of the checkout, not of a distribution.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mypyc.build import mypycify
from setuptools import Distribution

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from trimaran.compiled import GROUP, MODULES

    sources = [str(Path(*name.split(".")).with_suffix(".py")) for name in MODULES]
    extensions = mypycify(sources, opt_level="3", group_name=GROUP, target_dir="build/mypyc")
    build = Distribution({"name": "trimaran-compiled", "ext_modules": extensions})
    build.script_args = ["build_ext", "--inplace", "--build-temp", "build/mypyc/objects"]
    build.parse_command_line()
    build.run_commands()


if __name__ == "__main__":
    main()
