"""Pacing failed authentications, per source address, in bounded memory.

A worker with a token must make guessing it slow.  :class:`AuthThrottle`
keeps, for each source address that failed recently, how many times it failed
and when it may next be judged.  The server asks :meth:`AuthThrottle.admit`
before it judges a client's proof; an address with failures behind it waits
its turn, one attempt at a time (:meth:`AuthThrottle.reserve`):

* the ``n``-th consecutive failure from an address makes its next attempt wait
  ``min(penalty / 16 * 2**(n-1), penalty)`` seconds (``penalty`` is
  ``DYN_TCP_AUTH_PENALTY_SECS``), so a steady guesser gets one guess per
  ``penalty`` seconds *in total*, however many connections it opens at once:
  each queued attempt takes the next slot, and counts as a failure, before it
  is judged, and one whose slot would fall after its handshake deadline is
  refused at once (``close throttled``) instead of being held;
* a success forgets the address; so does ``forget_after`` seconds of quiet;
* an address that never failed is not stored at all, and the table holds at
  most ``max_addresses`` entries (the oldest go first).

Addresses are grouped as an attacker would spread them: IPv4 by host, IPv6 by
its /64 prefix.  This module is sans-IO: the caller passes the time and does
the waiting.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from typing import Final, final

__all__ = ["AuthThrottle", "source_key"]


def source_key(host: str) -> str:
    """The unit an address is throttled by: the IPv4 host, or the IPv6 /64 prefix."""
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class _Record:
    __slots__ = ("failures", "next_at")

    def __init__(self) -> None:
        self.failures = 0
        self.next_at = 0.0


@final
class AuthThrottle:
    """Failure-driven backoff per source (see the module docstring).

    Args:
        penalty: The longest wait between two judged attempts from one source.
        forget_after: Seconds of quiet after which a source's failures are forgotten.
        max_addresses: How many sources are remembered at most.
    """

    def __init__(
        self, penalty: float, *, forget_after: float = 60.0, max_addresses: int = 4096
    ) -> None:
        self.penalty: Final = penalty
        self._forget_after: Final = forget_after
        self._max: Final = max_addresses
        self._records: OrderedDict[str, _Record] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def _delay(self, failures: int) -> float:
        return float(min(self.penalty / 16 * 2.0 ** min(failures - 1, 16), self.penalty))

    def _record(self, key: str, now: float) -> _Record | None:
        record = self._records.get(key)
        if record is not None and now > record.next_at + self._forget_after:
            del self._records[key]
            return None
        return record

    def reserve(self, key: str, now: float, latest: float = float("inf")) -> float | None:
        """When an attempt from ``key`` may be judged (``now`` if at once), taking that slot.

        A source with no failure behind it is judged at once and nothing is
        stored.  Otherwise the attempt takes the next free slot and is counted
        as a failure in advance (a success forgets it all), so attempts that
        queue up together wait ever longer, exactly as if each had failed.
        Returns ``None``, and reserves nothing, if the slot would come after
        ``latest`` (the caller's deadline): the caller refuses the attempt
        instead of holding it.

        The caller must judge an immediate attempt without a checkpoint in
        between, and call :meth:`failed` or :meth:`succeeded` with the verdict.
        """
        record = self._record(key, now)
        if record is None:
            return now
        slot = max(now, record.next_at)
        if slot > latest:
            return None
        self._records.move_to_end(key)
        record.failures += 1
        record.next_at = slot + self._delay(record.failures)
        return slot

    def failed(self, key: str, now: float) -> None:
        """Record a failed authentication from ``key`` (judged without a reservation
        that counted it already)."""
        if self._record(key, now) is not None:
            return  # its reservation counted it
        record = self._records[key] = _Record()
        while len(self._records) > self._max:
            self._records.popitem(last=False)
        record.failures = 1
        record.next_at = now + self._delay(1)

    def succeeded(self, key: str) -> None:
        """Forget ``key``'s failures (it knows the token)."""
        self._records.pop(key, None)
