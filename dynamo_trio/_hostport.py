"""Addresses as text: ``host:port``, an IPv6 host in brackets (``[::1]:8000``)."""

from __future__ import annotations


def host_port(host: str, port: int | str) -> str:
    """``host:port`` as sockets' binds, URLs' authorities and logs write it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
