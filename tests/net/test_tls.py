"""The TLS listeners' process settings (trimaran/net/tls.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# In a fresh interpreter, as a server's heap goes: a block the size of uvloop's TLS read buffer is
# mapped and freed, then 200 more are taken for idle connections and left untouched. Prints how many
# of them glibc mapped on their own (bit 1 of the size word before a block, IS_MMAPPED) and the RSS
# they cost, in KiB. The count is exact; the RSS of heap blocks would hang on the interpreter's heap.
_PROBE = """
import ctypes, sys
from trimaran.net.tls import keep_large_blocks_mapped
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])
size = 256 * 1024
if sys.argv[1] == "fixed":
    assert keep_large_blocks_mapped()
libc.free(libc.malloc(size))  # a mapped block freed: glibc's threshold rises past it, unless fixed
start = rss()
idle = [libc.malloc(size) for _ in range(200)]
mapped = sum(ctypes.c_size_t.from_address(block - ctypes.sizeof(ctypes.c_size_t)).value & 2 != 0
             for block in idle)
print(mapped, rss() - start)
"""

# glibc's settings from the environment would decide for it.
_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}


def _probe(mode: str) -> tuple[int, int]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True, env=_ENV
    )
    mapped, rss = out.stdout.split()
    return int(mapped), int(rss)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc, /proc")
def test_idle_tls_read_buffers_stay_unresident_with_the_threshold_fixed() -> None:
    dynamic, fixed = _probe("dynamic"), _probe("fixed")
    # Dynamic: after the first free, the blocks come from the heap, where a server's freed and
    # written ones are resident. Fixed: every block is a mapping of its own, gone when freed, and an
    # idle one costs its first page.
    assert dynamic[0] == 0 and fixed[0] == 200, (dynamic, fixed)
    assert fixed[1] < 200 * 16, fixed
