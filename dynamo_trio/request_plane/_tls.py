"""TLS for the request plane: the ``ssl.SSLContext`` of each side (docs/protocol.md, "TLS")."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from .._config import RequestPlaneConfig


def server_context(config: RequestPlaneConfig) -> ssl.SSLContext:
    """The worker's context (ValueError if a needed file is not configured or cannot load)."""
    if config.tls_cert is None or config.tls_key is None:
        raise ValueError(
            "a TLS request-plane server needs a certificate and key "
            "(DYN_TCP_TLS_CERT and DYN_TCP_TLS_KEY)"
        )
    if config.tls_client_auth and config.tls_ca is None:
        raise ValueError(
            "DYN_TCP_TLS_CLIENT_AUTH needs the CA that signs client certificates (DYN_TCP_TLS_CA)"
        )
    client_ca = config.tls_ca if config.tls_client_auth else None
    context = _context(ssl.Purpose.CLIENT_AUTH, config, client_ca)
    if config.tls_client_auth:
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(config: RequestPlaneConfig) -> ssl.SSLContext:
    """The caller's context (ValueError if a configured file cannot be loaded)."""
    if config.tls_cert is not None and config.tls_key is None:
        raise ValueError("DYN_TCP_TLS_CERT is set without DYN_TCP_TLS_KEY")
    return _context(ssl.Purpose.SERVER_AUTH, config, config.tls_ca)


def _context(purpose: ssl.Purpose, config: RequestPlaneConfig, ca: Path | None) -> ssl.SSLContext:
    """TLS 1.2 or later, with the configured certificate chain and ``ca`` (beside the system's)."""
    context = ssl.create_default_context(purpose)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    what = f"certificate {config.tls_cert} with key {config.tls_key}"  # then the CA's
    try:
        if config.tls_cert is not None:
            context.load_cert_chain(str(config.tls_cert), str(config.tls_key))
        what = f"CA {ca}"
        if ca is not None:
            context.load_verify_locations(cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the request-plane {what}: {exc}") from None
    return context
