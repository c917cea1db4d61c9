"""Addresses as text (``dynamo_trio._hostport``), and that the edge binds what it writes."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given, strategies as st

from dynamo_trio._hostport import host_port
from dynamo_trio.edge import listen_sockets
from dynamo_trio.request_plane import parse_address


@pytest.mark.parametrize(
    ("host", "port", "text"),
    [
        ("127.0.0.1", 8000, "127.0.0.1:8000"),
        ("localhost", "80", "localhost:80"),
        ("::1", 8000, "[::1]:8000"),
        ("fe80::1%eth0", 1, "[fe80::1%eth0]:1"),
    ],
)
def test_ipv6_hosts_are_bracketed(host: str, port: int | str, text: str) -> None:
    assert host_port(host, port) == text


@given(
    st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).map(str),
    st.integers(min_value=0, max_value=65535),
)
def test_the_request_plane_reads_back_what_is_written(host: str, port: int) -> None:
    assert parse_address(host_port(host, port)) == (host, port)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_the_edge_binds_the_address_as_written(host: str) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if not socket.has_ipv6 and family == socket.AF_INET6:
        pytest.skip("no IPv6 on this machine")
    try:
        [sock] = listen_sockets([host_port(host, 0)])
    except OSError as exc:
        pytest.skip(f"cannot bind {host}: {exc}")
    with sock:
        assert sock.family == family
        assert sock.getsockname()[0] == host
