"""TLS for the request plane: the ``ssl.SSLContext`` of each side (docs/protocol.md, "TLS")."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._config import RequestPlaneConfig


def server_context(config: RequestPlaneConfig) -> ssl.SSLContext:
    """The worker's context (ValueError if a needed file is not configured or cannot load)."""
    if config.tls_cert is None or config.tls_key is None:
        raise ValueError(
            "a TLS request-plane server needs a certificate and key "
            "(DYN_TCP_TLS_CERT and DYN_TCP_TLS_KEY)"
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, config)
    if config.tls_client_auth:
        if config.tls_ca is None:
            raise ValueError(
                "DYN_TCP_TLS_CLIENT_AUTH needs the CA that signs client certificates "
                "(DYN_TCP_TLS_CA)"
            )
        _load_ca(context, config)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(config: RequestPlaneConfig) -> ssl.SSLContext:
    """The caller's context (ValueError if a configured file cannot be loaded)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if config.tls_ca is not None:
        _load_ca(context, config)
    if config.tls_cert is not None:
        if config.tls_key is None:
            raise ValueError("DYN_TCP_TLS_CERT is set without DYN_TCP_TLS_KEY")
        _load_chain(context, config)
    return context


def _load_chain(context: ssl.SSLContext, config: RequestPlaneConfig) -> None:
    try:
        context.load_cert_chain(str(config.tls_cert), str(config.tls_key))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"cannot load the request-plane certificate {config.tls_cert} "
            f"with key {config.tls_key}: {exc}"
        ) from None


def _load_ca(context: ssl.SSLContext, config: RequestPlaneConfig) -> None:
    try:
        context.load_verify_locations(cafile=str(config.tls_ca))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the request-plane CA {config.tls_ca}: {exc}") from None
