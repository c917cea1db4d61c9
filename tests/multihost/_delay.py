"""Delay forwarded packets in flight: a userspace stand-in for ``tc netem delay``.

Run in the router namespace as ``python _delay.py p1=50 p3=5``: every packet
the firewall sends to NFQUEUE 0 is held for the delay of the link it came in
on plus the delay of the link it goes out on (milliseconds), then released
unchanged (``NF_ACCEPT``).  Packets are never copied to userspace (metadata
only), never dropped here, and leave in the order they became due, so a link
with a fixed delay keeps its packets in order, as netem's does.

This speaks nfnetlink_queue directly over a netlink socket (no library):
bind queue 0, ask for metadata only, read ``NFQNL_MSG_PACKET`` messages
(packet id, in/out interface), answer each with ``NFQNL_MSG_VERDICT`` when
its time has come.  It prints ``ready`` once bound and runs until SIGTERM.
The loop is bounded by its input: each iteration either releases due
packets or waits for the next packet or due time.
"""

from __future__ import annotations

import errno
import heapq
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_IFINDEX_INDEV = 5
NFQA_IFINDEX_OUTDEV = 6
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NF_ACCEPT = 1
QUEUE = 0
MAX_QUEUED = 65536


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _message(kind: int, attrs: bytes, *, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(QUEUE)) + attrs
    header = struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, seq, 0)
    return header + body


def _attrs(data: bytes) -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    offset = 0
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        found[kind & 0x3FFF] = data[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    return found


def _configure(sock: socket.socket) -> None:
    cmd = _attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, socket.AF_INET))
    params = _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
    maxlen = _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", MAX_QUEUED))
    for seq, attrs in enumerate((cmd, params + maxlen), start=1):
        sock.send(_message(NFQNL_MSG_CONFIG, attrs, flags=NLM_F_REQUEST | NLM_F_ACK, seq=seq))
        reply = sock.recv(65536)
        _, kind, _, _, _ = struct.unpack_from("=IHHII", reply)
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", reply, 16)
            if code != 0:
                raise OSError(-code, f"nfqueue config: {errno.errorcode.get(-code, code)}")


def main(argv: list[str]) -> None:
    by_name = {}
    for spec in argv:
        name, _, ms = spec.partition("=")
        by_name[name] = float(ms) / 1000
    delays = {socket.if_nametoindex(name): seconds for name, seconds in by_name.items()}

    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((0, 0))
    _configure(sock)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("ready", flush=True)

    held: list[tuple[float, int, int]] = []  # (due, sequence, packet id)
    sequence = 0
    while True:
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, _, packet_id = heapq.heappop(held)
            verdict = _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))
            sock.send(_message(NFQNL_MSG_VERDICT, verdict))
        timeout = None if not held else max(0.0, held[0][0] - time.monotonic())
        readable, _, _ = select.select([sock], [], [], timeout)
        if not readable:
            continue
        try:
            data = sock.recv(1 << 20)
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:  # the kernel dropped messages: carry on
                continue
            raise
        arrived = time.monotonic()
        offset = 0
        while offset + 16 <= len(data):
            length, kind, _, _, _ = struct.unpack_from("=IHHII", data, offset)
            if length < 16:
                break
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                attrs = _attrs(data[offset + 20 : offset + length])
                (packet_id,) = struct.unpack_from("!I", attrs[NFQA_PACKET_HDR])
                delay = 0.0
                for attr in (NFQA_IFINDEX_INDEV, NFQA_IFINDEX_OUTDEV):
                    if attr in attrs:
                        delay += delays.get(struct.unpack("!I", attrs[attr])[0], 0.0)
                sequence += 1
                heapq.heappush(held, (arrived + delay, sequence, packet_id))
            offset += (length + 3) & ~3


if __name__ == "__main__":
    main(sys.argv[1:])
