"""The TLS listeners' process settings (trimaran/net/tls.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# In a fresh interpreter, as a server's heap goes: blocks the size of uvloop's TLS read buffer are
# written and freed among small ones that stay (so the heap cannot shrink), then as many are taken
# for idle connections and left untouched. Prints the RSS they cost in the end, in KiB.
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
blocks, pins = [], []
for _ in range(200):
    blocks.append(libc.malloc(size))
    ctypes.memset(blocks[-1], 1, size)
    pins.append(libc.malloc(64))
for block in blocks:
    libc.free(block)
idle = [libc.malloc(size) for _ in range(200)]
print(rss() - start)
"""


def _rss_after(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc, /proc")
def test_idle_tls_read_buffers_stay_unresident_with_the_threshold_fixed() -> None:
    dynamic, fixed = _rss_after("dynamic"), _rss_after("fixed")
    # Dynamic: the idle blocks reuse the written ones in the heap, 200 x 256 KiB resident. Fixed:
    # every block is a mapping of its own, gone when freed, and an idle one costs its first page.
    assert dynamic > 200 * 200 and fixed < 200 * 16, (fixed, dynamic)
