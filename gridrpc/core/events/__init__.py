"""Structured lifecycle events and the bounded log the dashboard reads.

Every element of the tree reports what happens to it and to the calls it
handles as :class:`Event` values (DIET's VizDIET did the same with
``ADD_SERVICE``, ``ASK_FOR_SED``, ``SED_CHOSEN``, ``BEGIN_SOLVE``,
``END_SOLVE``...). Events travel up the tree in bounded outboxes
(:class:`EventOutbox`: the oldest are dropped, and counted, rather than
blocking) and end in the MA's :class:`EventLog`: a count-bounded ring, an
index by request id (one call's whole story) and rolling aggregates per
service and per user, from which the dashboard, ``gridrpc top`` and
``/metrics`` read.

Pure: no asyncio, no zmq, no clock, no os. Times are arguments: an event
carries the emitter's clock (``time``, unix seconds, for display); the log
buckets events by the ``now`` its owner passes to :meth:`EventLog.append`
(the MA's clock), so skewed or hostile clocks elsewhere cannot distort rates.

Trust: constructing an :class:`Event` does no validation (it is the hot path
of trusted in-process emitters; use :func:`make_event`, which bounds and
sanitises names and detail cheaply). Anything that crossed the network goes
through :meth:`Event.from_dict` / :meth:`Event.from_json` /
:func:`decode_events`, which check every field.

Layout: the event, its kinds and validation are in
:mod:`gridrpc.core.events.event`; sinks and the outbox in
:mod:`gridrpc.core.events.outbox`; the log and its aggregates in
:mod:`gridrpc.core.events.log`. Every name is importable from here.
"""
from __future__ import annotations

from .log import EventLog, story_summary
from .log import OTHER, quantile  # noqa: F401 - importable from here too
from .outbox import EventOutbox, EventSink, NullSink
from .event import (ERROR_KINDS, LATENCY_BOUNDS, OUTCOME, TERMINAL, Event, EventKind, InvalidEvent,
                          decode_events, make_event)
from .event import (ID_RE, MAX_DETAIL, MAX_DURATION, MAX_TIME, NAME_RE, SERVICE_RE,  # noqa: F401
                          USER_RE)

__all__ = ["EventKind", "Event", "make_event", "decode_events", "EventSink", "NullSink",
           "EventOutbox", "EventLog", "TERMINAL", "OUTCOME", "ERROR_KINDS", "LATENCY_BOUNDS",
           "InvalidEvent", "story_summary"]
