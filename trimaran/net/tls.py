"""The server's TLS context for the TLS and secure WebSocket listeners."""

from __future__ import annotations

import ssl

from trimaran.config import TlsSettings


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
