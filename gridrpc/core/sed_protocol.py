"""What a SeD answers, as pure functions of the message and its state.

The SeD runtime (:mod:`gridrpc.sed.server`, :mod:`gridrpc.sed.calls.receive`,
:mod:`gridrpc.sed.calls.run`) and the simulator's SeD process
(:mod:`gridrpc.sim.sed_node`) build every answer with these functions, so
the two cannot answer differently: the DISCOVER answer for the replicas a
message names, the replica a CALL is for, the refusal of another client's
call id, the busy answer to a ``start_now`` probe, ACCEPTED, and the errors
of a stopped, dropped or forgotten call. Nothing here does I/O or reads a
clock: estimation vectors and timings are arguments.
"""
from __future__ import annotations

from typing import Mapping, TypeVar

from . import messages as m
from .messages import MsgType

__all__ = ["accepted_header", "busy_error", "call_replica", "discover_replicas", "discover_reply", "drop_error",
           "gone_error", "not_owner_error", "stop_error"]

R = TypeVar("R")


def discover_replicas(h: dict, this: R, replicas: Mapping[str, R]) -> list[R]:
    """The replicas a DISCOVER received by ``this`` asks for: those it names
    (``names``: an agent asks every replica of one process at once) that this
    process holds, else ``this``."""
    names = h.get("names") if isinstance(h.get("names"), list) else None
    if names is None:
        return [this]
    return [replicas[n] for n in names if isinstance(n, str) and n in replicas] or [this]


def discover_reply(h: dict, this_name: str, names: list[str], estimations: list[dict] | None, *, address: str,
                   public_key: str | None = None, idempotent: bool = True) -> dict:
    """The SERVERS answer to a DISCOVER (``h``) for the replicas ``names``
    (:func:`discover_replicas`), sent by the replica ``this_name``: one
    server per replica with its estimation vector (``estimations``, in the
    same order), none if the service is not offered here (``estimations``
    None). Under CURVE each server carries the SeD's ``public_key`` (the
    client pins it); a service that is not idempotent says so."""
    if estimations is None:
        servers: list = []
    else:
        servers = [{"name": n, "address": address, "estimation": e} for n, e in zip(names, estimations)]
        if public_key:
            for s in servers:
                s["public_key"] = public_key
        if not idempotent:
            for s in servers:
                s["idempotent"] = False
    reply = m.make(MsgType.SERVERS, h["id"], name=this_name, servers=servers)
    if len(names) > 1:
        reply["names"] = list(names)
    return reply


def call_replica(h: dict, replicas: Mapping[str, R]) -> R | None:
    """The replica a CALL is for: the one it names (``sed``), or the only
    one of a single-replica process when it names none; None: not here."""
    target = h.get("sed")
    if target is None and len(replicas) == 1:
        return next(iter(replicas.values()))
    return replicas.get(target) if isinstance(target, str) else None


def not_owner_error(call_id: str, sed_name: str) -> dict:
    """A CALL whose id belongs to another client's call."""
    return m.error_header(call_id, "refused", f"call id {call_id} belongs to another client of SeD {sed_name} "
                          "(a call is answered, cancelled or pinged only by its owner)")


def busy_error(call_id: str, sed_name: str, service: str, est_wait: float) -> dict:
    """A ``start_now`` probe that finds no free slot: never queued here."""
    err = m.error_header(call_id, "busy", f"SeD {sed_name} has no free slot for {service} now", type_="Busy")
    err["error"]["est_wait"] = est_wait
    return err


def accepted_header(call_id: str, sed_name: str, *, running: bool, idempotent: bool = True,
                    duplicate: bool = False) -> dict:
    """ACCEPTED of a call (``duplicate``: a repeated id of a live call)."""
    h = m.make(MsgType.ACCEPTED, call_id, sed=sed_name)
    if duplicate:
        h["duplicate"] = True
    h["state"] = "running" if running else "queued"
    if not idempotent:
        h["idempotent"] = False
    return h


def stop_error(call_id: str, reason: str, sed_name: str, **timing) -> dict:
    """The answer of a running call stopped by its queue (``reason``:
    ``preempted`` by a mandatory call, or cancelled)."""
    kind = "preempted" if reason == "preempted" else "cancelled"
    return m.error_header(call_id, kind, f"call {reason} on {sed_name}" + (
        " (a mandatory request needed the server)" if kind == "preempted" else ""), **timing)


def drop_error(call_id: str, **timing) -> dict:
    """The answer of a queued call cancelled before it started."""
    return m.error_header(call_id, "cancelled", "call cancelled while queued", **timing)


def gone_error(call_id: str, sed_name: str, cache_bytes: int) -> dict:
    """A repeated id of a call that ran and whose answer is no longer kept."""
    return m.error_header(call_id, "result_gone", f"call {call_id} already ran on SeD {sed_name}; its answer is "
                          f"no longer kept (result cache of {cache_bytes} bytes) and it is not run again",
                          type_="ResultGone")
