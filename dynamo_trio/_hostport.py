"""Addresses as text: ``host:port``, an IPv6 host in brackets (``[::1]:8000``), written by
:func:`host_port` and read by :func:`parse_address`."""

from __future__ import annotations


def host_port(host: str, port: int | str) -> str:
    """``host:port`` as sockets' binds, URLs' authorities and logs write it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(address: str) -> tuple[str, int]:
    """Split ``"host:port"`` or ``"[v6]:port"`` (ValueError without a valid port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad address {address!r}: expected host:port")
    return host.strip("[]"), int(port)
