"""Hosts as Linux network namespaces, joined by a router whose links can fail.

Topology
========

Every host is a network namespace with one interface, ``eth0``, the end of a
veth pair whose other end (``p<i>``) sits in a *router* namespace::

    host i (ns "<prefix>-<name>")            router (ns "<prefix>-router")
    eth0 10.211.<i>.2/24  <------ veth ------>  p<i> 10.211.<i>.1/24
    default via 10.211.<i>.1                      ip_forward = 1

so hosts talk through the router, each on its own subnet, as machines in
different racks would.  Only these namespace-internal addresses are used; the
machine's own namespace is never touched (no interface, route or rule is
added there).

Faults, all made in the router, on a host's link
================================================

* ``link_down``: the router's end of the link goes down; the host's ``eth0``
  loses carrier (a pulled cable: the host's packets go nowhere, nothing tells
  its TCP stack).
* ``blackhole``: every packet to or from the host is dropped by a firewall
  rule while the link stays up (``tc netem loss 100%``).
* ``loss``: each packet to or from the host is dropped with a probability
  (``iptables -m statistic --mode random``; ``tc netem loss N%``).
* ``delay``: each packet to or from the host is held for a fixed time before
  it is forwarded.  This kernel has no ``netem`` qdisc (nor ``fq``/``etf``,
  which could pace by timestamp), so packets are handed to a userspace
  process over NFQUEUE (:mod:`._delay`) that releases each one when its delay
  has passed: the packet itself is delayed in flight, as netem would, not
  the byte stream (a TCP relay would hide loss and reordering from TCP).
* ``partition(a, b)``: packets between two hosts are dropped, both ways,
  while each still reaches every other host.

The firewall is rendered whole from :attr:`Network.faults` and loaded with
``iptables-restore`` (atomic), so a fault is added or cleared in one step.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

import trio

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

__all__ = [
    "Host",
    "LinkFaults",
    "Network",
    "NetworkUnavailable",
    "in_netns",
    "process_sits_in",
    "remove_stale_namespaces",
]

_CLONE_NEWNET: Final = 0x40000000
_NETNS_DIR: Final = Path("/run/netns")
_DELAY_SCRIPT: Final = Path(__file__).with_name("_delay.py")
_NAME_PREFIX: Final = "dmh"
_STALE = re.compile(rf"^{_NAME_PREFIX}(\d+)-")

_libc = ctypes.CDLL(None, use_errno=True)


class NetworkUnavailable(RuntimeError):
    """Network namespaces (or the tools to build them) are not available here."""


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


@contextlib.contextmanager
def in_netns(namespace: str) -> Iterator[None]:
    """Run the block's socket calls in ``namespace`` (this thread only).

    A socket belongs to the namespace its creating thread was in: sockets
    made inside the block stay in ``namespace`` after it.  The thread's own
    namespace is restored on exit, whatever happens.
    """
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(_NETNS_DIR / namespace, os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)


@contextlib.contextmanager
def process_sits_in(namespace: str) -> Iterator[None]:
    """:func:`in_netns` for this thread, for as long as the block runs; on the way out,
    the worker threads trio cached meanwhile are moved back too.

    A new thread starts in its creator's namespace, and trio keeps its worker threads
    for reuse: without this, a thread made during the block would later open sockets,
    or start child processes, in ``namespace`` for tests that know nothing of it.
    """
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        with in_netns(namespace):
            yield
        _move_cached_threads(own)
    finally:
        os.close(own)


# More than trio ever keeps: its thread limiter lets 40 run at once.
_CACHED_THREADS_AT_MOST: Final = 256


def _move_cached_threads(namespace_fd: int) -> None:
    """Give every idle cached trio worker thread a job that moves it to ``namespace_fd``.

    The jobs wait for each other, so no thread takes two and every idle one takes
    one; threads started for the extra jobs start here, in this thread's namespace.
    """
    release = threading.Event()
    moved = threading.Semaphore(0)

    def move() -> None:
        try:
            _setns(namespace_fd)
        finally:
            moved.release()
            release.wait()

    for _ in range(_CACHED_THREADS_AT_MOST):
        trio.lowlevel.start_thread_soon(move, lambda _outcome: None)
    for _ in range(_CACHED_THREADS_AT_MOST):
        moved.acquire()
    release.set()


def _run(*argv: str, input: str | None = None, check: bool = True) -> str:
    result = subprocess.run(
        argv, input=input, capture_output=True, text=True, timeout=30, check=False
    )
    if check and result.returncode != 0:
        raise NetworkUnavailable(
            f"`{' '.join(argv)}` failed ({result.returncode}): {result.stderr.strip()}"
        )
    return result.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_processes(namespace: str) -> None:
    pids = _run("ip", "netns", "pids", namespace, check=False).split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def remove_stale_namespaces() -> list[str]:
    """Delete the namespaces of earlier test runs whose process is gone (bounded: one pass)."""
    removed = []
    for line in _run("ip", "netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        match = _STALE.match(name)
        if match and not _pid_alive(int(match.group(1))):
            _kill_namespace_processes(name)
            _run("ip", "netns", "del", name, check=False)
            removed.append(name)
    return removed


@dataclass
class LinkFaults:
    """What is wrong with one host's link (all off by default)."""

    blackhole: bool = False
    loss: float = 0.0
    """Probability that a packet is dropped, each direction."""
    delay_ms: float = 0.0
    """Added one-way delay, each direction."""

    @property
    def any(self) -> bool:
        return self.blackhole or self.loss > 0 or self.delay_ms > 0


@dataclass(frozen=True)
class Host:
    """One namespace host."""

    name: str
    index: int
    namespace: str

    @property
    def address(self) -> str:
        return f"10.211.{self.index}.2"

    @property
    def port(self) -> str:
        """The router's end of this host's link."""
        return f"p{self.index}"


@dataclass
class Network:
    """The namespaces, the router and the faults on its links.

    Args:
        names: The hosts to make, in order (``10.211.1.2`` is the first).
        tag: Goes into every namespace name (with this process's pid, so that
            concurrent runs never collide and stale ones can be found).
    """

    names: Sequence[str]
    tag: str = ""
    hosts: dict[str, Host] = field(init=False, default_factory=dict)
    faults: dict[str, LinkFaults] = field(init=False, default_factory=dict)
    partitions: set[frozenset[str]] = field(init=False, default_factory=set)
    down: set[str] = field(init=False, default_factory=set)
    """Hosts whose link is down."""
    _delayer: subprocess.Popen[bytes] | None = field(init=False, default=None)
    _delayed: dict[str, float] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        prefix = f"{_NAME_PREFIX}{os.getpid()}-{self.tag}"
        self.router = f"{prefix}router"
        for index, name in enumerate(self.names, start=1):
            self.hosts[name] = Host(name, index, f"{prefix}{name}")

    # -- building -------------------------------------------------------------

    @staticmethod
    def check_available() -> None:
        """Raise :class:`NetworkUnavailable` saying what is missing to build a network."""
        if sys.platform != "linux":
            raise NetworkUnavailable("network namespaces need Linux")
        if os.geteuid() != 0:
            raise NetworkUnavailable("creating network namespaces needs root")
        for tool in ("ip", "iptables", "iptables-restore"):
            if shutil.which(tool) is None:
                raise NetworkUnavailable(
                    f"`{tool}` is not installed (apt-get install iproute2 iptables)"
                )

    def build(self) -> None:
        """Make the router, every host and their links; raise NetworkUnavailable on failure."""
        self.check_available()
        remove_stale_namespaces()
        try:
            self._build()
        except BaseException:
            self.destroy()
            raise

    def _build(self) -> None:
        router = self.router
        _run("ip", "netns", "add", router)
        _run("ip", "-n", router, "link", "set", "lo", "up")
        _run("ip", "netns", "exec", router, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
        for host in self.hosts.values():
            ns = host.namespace
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run(
                "ip", "-n", router, "link", "add", host.port, "type", "veth",
                "peer", "name", "eth0", "netns", ns,
            )  # fmt: skip
            _run("ip", "-n", router, "addr", "add", f"10.211.{host.index}.1/24", "dev", host.port)
            _run("ip", "-n", router, "link", "set", host.port, "up")
            _run("ip", "-n", ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "route", "add", "default", "via", f"10.211.{host.index}.1")
            self.faults[host.name] = LinkFaults()
        self._apply_firewall()

    def destroy(self) -> None:
        """Kill every process left in the namespaces and delete them (idempotent)."""
        self._stop_delayer()
        for namespace in [h.namespace for h in self.hosts.values()] + [self.router]:
            if (_NETNS_DIR / namespace).exists():
                _kill_namespace_processes(namespace)
                _run("ip", "netns", "del", namespace, check=False)

    # -- using ----------------------------------------------------------------

    def host(self, name: str) -> Host:
        return self.hosts[name]

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self.hosts[host].namespace, *argv]

    # -- faults ---------------------------------------------------------------

    def link_down(self, host: str) -> None:
        _run("ip", "-n", self.router, "link", "set", self.hosts[host].port, "down")
        self.down.add(host)

    def link_up(self, host: str) -> None:
        _run("ip", "-n", self.router, "link", "set", self.hosts[host].port, "up")
        self.down.discard(host)

    def cut_off(self, host: str) -> bool:
        """Whether ``host`` is cut off from every other host (link down or blackholed)."""
        return host in self.down or self.faults[host].blackhole

    def set_faults(
        self,
        host: str,
        *,
        blackhole: bool = False,
        loss: float = 0.0,
        delay_ms: float = 0.0,
    ) -> None:
        """Replace the faults of ``host``'s link (no arguments: a healthy link)."""
        self.faults[host] = LinkFaults(blackhole=blackhole, loss=loss, delay_ms=delay_ms)
        self._apply()

    def partition(self, a: str, b: str) -> None:
        """Drop every packet between hosts ``a`` and ``b`` (each still reaches the others)."""
        self.partitions.add(frozenset((a, b)))
        self._apply()

    def heal(self) -> None:
        """Clear every fault: links up, no firewall rule, no delay."""
        for host in self.hosts:
            self.link_up(host)
            self.faults[host] = LinkFaults()
        self.partitions.clear()
        self._apply()

    def _apply(self) -> None:
        delays = {
            self.hosts[name].port: faults.delay_ms
            for name, faults in self.faults.items()
            if faults.delay_ms > 0 and not faults.blackhole
        }
        if delays != self._delayed:
            # Rules first (no packet is queued to a delayer that is going away),
            # then the delayer, then the rules that use it.
            self._apply_firewall(queue=False)
            self._stop_delayer()
            if delays:
                self._start_delayer(delays)
            self._delayed = delays
        self._apply_firewall()

    def _apply_firewall(self, *, queue: bool = True) -> None:
        lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
        for pair in sorted(self.partitions, key=sorted):
            a, b = (self.hosts[name].port for name in sorted(pair))
            lines += [f"-A FORWARD -i {a} -o {b} -j DROP", f"-A FORWARD -i {b} -o {a} -j DROP"]
        for name, faults in self.faults.items():
            port = self.hosts[name].port
            for direction in ("-i", "-o"):
                if faults.blackhole:
                    lines.append(f"-A FORWARD {direction} {port} -j DROP")
                elif faults.loss > 0:
                    lines.append(
                        f"-A FORWARD {direction} {port} -m statistic --mode random "
                        f"--probability {faults.loss:.4f} -j DROP"
                    )
        if queue:
            for port in self._delayed:
                for direction in ("-i", "-o"):
                    lines.append(
                        f"-A FORWARD {direction} {port} -j NFQUEUE --queue-num 0 --queue-bypass"
                    )
        lines.append("COMMIT")
        _run(
            "ip", "netns", "exec", self.router, "iptables-restore",
            input="\n".join(lines) + "\n",
        )  # fmt: skip

    def _start_delayer(self, delays: dict[str, float]) -> None:
        argv = [sys.executable, str(_DELAY_SCRIPT), *(f"{p}={ms}" for p, ms in delays.items())]
        process = subprocess.Popen(
            ["ip", "netns", "exec", self.router, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stdout is not None
        line = process.stdout.readline()  # "ready" once bound to the queue
        if line.strip() != b"ready":
            process.kill()
            _, err = process.communicate(timeout=5)
            raise NetworkUnavailable(
                f"the NFQUEUE delayer did not start: {line!r} {err.decode(errors='replace')}"
            )
        self._delayer = process

    def _stop_delayer(self) -> None:
        process, self._delayer = self._delayer, None
        if process is None:
            return
        # Let packets already held go out before the queue is unbound.
        time.sleep(max(self._delayed.values(), default=0) * 2 / 1000 + 0.01)
        process.terminate()
        try:
            process.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
