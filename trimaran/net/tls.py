"""The server's TLS context for the TLS and secure WebSocket listeners."""

from __future__ import annotations

import ctypes
import ssl

from trimaran.config import TlsSettings

# Where the loop serves TLS (no epoll: runtime/poller.py serves it everywhere else), uvloop gives each
# TLS connection a 256 KiB read buffer from malloc. Above glibc's mmap threshold a
# block is mapped on its own and its untouched pages are never resident; but glibc raises the
# threshold to the size of every mapped block freed, and from then on the buffers come from the
# heap, whose reused pages are resident: 48.7 KiB an idle TLS connection instead of 26.2 (issue 47).
MMAP_THRESHOLD = 128 * 1024
# Fixing one fixes the other, at 128 KiB: the heap would then be trimmed and grown again all the time.
TRIM_THRESHOLD = 4 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def server_tls_context(settings: TlsSettings) -> ssl.SSLContext:
    if settings.cert_file is None or settings.key_file is None:
        raise ValueError("listeners.tls.cert_file and listeners.tls.key_file are needed for a TLS listener")
    for key, path in (
        ("cert_file", settings.cert_file),
        ("key_file", settings.key_file),
        ("ca_file", settings.ca_file),
    ):
        if path is not None and not path.is_file():  # ssl's own error names no file
            raise ValueError(f"{key} {path} does not exist or is not a file")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = (
        ssl.TLSVersion.TLSv1_3 if settings.min_version == "1.3" else ssl.TLSVersion.TLSv1_2
    )
    context.load_cert_chain(settings.cert_file, settings.key_file)
    if settings.ca_file is not None:
        context.load_verify_locations(settings.ca_file)
        context.verify_mode = ssl.CERT_REQUIRED if settings.require_client_cert else ssl.CERT_OPTIONAL
    return context


def keep_large_blocks_mapped() -> bool:
    """Fix the C library's mmap threshold at ``MMAP_THRESHOLD``, so that it no longer rises as
    mapped blocks are freed. False where there is no such setting (a C library other than glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
