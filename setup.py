"""The wheel's one dynamic part: the hot modules compiled with mypyc (scripts/mypyc_build.py, the same
build as ``make compile``), or a pure wheel where they cannot be, said in one line. Everything else
is in pyproject.toml. TRIMARAN_BUILD=pure|compiled forces either (docs/performance.md)."""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
import mypyc_build

# Only the commands that build a wheel or install compile: metadata (egg_info, dist_info), the sdist
# and the editable install (whose tree `make compile` builds in place) do not.
BUILDS = {"bdist_wheel", "build", "build_ext", "install"}


class BuildExt(build_ext):
    """build_ext that falls back to the pure wheel when the C build fails (unless compiled is forced)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # CompileError, LinkError, a missing header: the compiler's to say
            if mypyc_build.mode() == "compiled":
                raise
            mypyc_build.say(f"the C build failed ({type(error).__name__}: {error})")
            self.distribution.ext_modules = []
            self.extensions = []
            for built in Path(self.build_lib).rglob("*.so"):
                built.unlink()
            wheel = self.distribution.command_obj.get("bdist_wheel")
            if wheel is not None:
                wheel.root_is_pure = True


def ext_modules() -> list[object]:
    if not BUILDS.intersection(sys.argv[1:]):
        return []
    why = mypyc_build.plan()
    if why is None:
        try:
            return mypyc_build.extensions(Path.cwd())
        except (Exception, SystemExit) as error:  # mypyc exits on a type error
            if mypyc_build.mode() == "compiled":
                raise
            why = f"mypyc failed ({type(error).__name__}: {error})"
    mypyc_build.say(why)
    return []


if __name__ == "__main__":  # as setuptools' build backend runs it; tests/test_wheel.py imports it
    setup(ext_modules=ext_modules(), cmdclass={"build_ext": BuildExt})
