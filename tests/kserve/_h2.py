"""One gRPC call made byte by byte over HTTP/2 (with the ``h2`` package hypercorn uses),
for what no gRPC client sends: a declared length of gigabytes, a decompression bomb."""

from __future__ import annotations

from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import trio


@dataclass
class H2Reply:
    headers: dict[str, str] = field(default_factory=dict)
    data: bytes = b""
    trailers: dict[str, str] = field(default_factory=dict)
    reset: bool = False


async def h2_call(
    address: str,
    path: str,
    body: bytes,
    *,
    end_stream: bool = True,
    headers: tuple[tuple[str, str], ...] = (),
    within: float = 10,
) -> H2Reply:
    """POST ``body`` as the DATA of one gRPC call to ``path`` (with ``headers`` beside
    gRPC's own); the reply as received."""
    host, _, port = address.rpartition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    connection.send_headers(
        1,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":authority", address),
            (":path", path),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *headers,
        ],
    )
    size = connection.max_outbound_frame_size  # the body fits the flow window (64 KiB)
    chunks = [body[start : start + size] for start in range(0, len(body), size)] or [b""]
    for index, chunk in enumerate(chunks):
        connection.send_data(1, chunk, end_stream=end_stream and index == len(chunks) - 1)
    reply = H2Reply()
    try:
        with trio.fail_after(within):
            await stream.send_all(connection.data_to_send())
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return reply
                for event in connection.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived):
                        reply.headers = _decoded(event.headers)
                    elif isinstance(event, h2.events.DataReceived):
                        reply.data += event.data
                        connection.acknowledge_received_data(event.flow_controlled_length, 1)
                    elif isinstance(event, h2.events.TrailersReceived):
                        reply.trailers = _decoded(event.headers)
                    elif isinstance(event, h2.events.StreamReset):
                        reply.reset = True
                    if isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                        return reply
                await stream.send_all(connection.data_to_send())
    finally:
        await stream.aclose()


def _decoded(headers: list[tuple[bytes, bytes]] | list[tuple[str, str]]) -> dict[str, str]:
    return {
        (name.decode() if isinstance(name, bytes) else name): (
            value.decode() if isinstance(value, bytes) else value
        )
        for name, value in headers
    }
