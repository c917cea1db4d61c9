"""The request a task works for, so that its log lines say which request and trace:
:func:`bind_request` sets a context variable (trio copies it into started tasks) that
:class:`RequestLogFilter` reads.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Final, final

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ._context import Context

LOG_FORMAT: Final = "%(asctime)s %(levelname)-7s %(name)s%(request_context)s: %(message)s"

_current: Final[ContextVar[Context | None]] = ContextVar("dynamo_trio_request", default=None)
_MAX_SHOWN: Final = 256


def current_request() -> Context | None:
    """The context of the request the current task works for, if any."""
    return _current.get()


@contextmanager
def bind_request(context: Context) -> Iterator[Context]:
    """Make ``context`` the current request for the block (and the tasks started in it)."""
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def _shown(value: str) -> str:
    if len(value) <= _MAX_SHOWN and value.isprintable() and " " not in value:
        return value
    return repr(value[:_MAX_SHOWN])


@final
class RequestLogFilter(logging.Filter):
    """Adds ``request_id``, ``trace_id``, ``span_id`` and ``request_context`` to records
    (``-`` and empty outside a request); attach it to a *handler*.  It drops none."""

    def filter(self, record: logging.LogRecord) -> bool:
        if hasattr(record, "request_context"):
            return True  # set already (by another filter, or by ``extra=``)
        context = _current.get()
        if context is None:
            record.request_id = record.trace_id = record.span_id = "-"
            record.request_context = ""
            return True
        record.request_id = request_id = _shown(context.id())
        record.trace_id = trace_id = context.trace_id or "-"
        record.span_id = context.span_id or "-"
        record.request_context = f" [request_id={request_id} trace_id={trace_id}]"
        return True
