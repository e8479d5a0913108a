"""Data references inside values (pure): descriptors, light forms, walking.

A reference travels inside an encoded value as a descriptor::

    {"__t": "ref", "id": "r-...", "holder": "sed-1", "address": "tcp://...",
     "size": 800000000, "mode": "persistent", "replicas": [["sed-2", "tcp://..."]],
     "call": false}

``call: true`` names the result of a pending call that did not keep it (the
holder serves it from the call's answer). The SeD that receives a call
holding references fetches their bytes from the holder (or a replica)
before queueing the call; the client never sees them.

Reference ids are request ids (:func:`gridrpc.core.fields.valid_id`):
never paths, never code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ProtocolError
from .fields import valid_id, valid_name

__all__ = ["RefTag", "decode_ref", "light_ref", "find_refs", "substitute", "fetch_bytes", "refs_in_light"]

_MISSING = object()


@dataclass(frozen=True, slots=True, eq=False)
class RefTag:
    """A decoded reference: its descriptor, and its value when the holder
    returned it too (``persistent_return``)."""
    desc: dict
    value: Any = _MISSING

    @property
    def id(self) -> str:
        return self.desc["id"]

    @property
    def has_value(self) -> bool:
        return self.value is not _MISSING

    def __gridrpc_ref__(self) -> dict:
        return self.desc

    def holders(self) -> list[tuple[str, str]]:
        """(name, address) of the holder then the replicas."""
        out = [(self.desc["holder"], self.desc.get("address") or "")]
        for r in self.desc.get("replicas") or []:
            out.append((r[0], r[1]))
        return out


def decode_ref(tree: dict, decode_value: Callable[[Any], Any]) -> RefTag:
    i, holder = tree.get("id"), tree.get("holder")
    if not valid_id(i):
        raise ProtocolError(f"malformed data reference: bad id {i!r:.80}")
    if not valid_name(holder):
        raise ProtocolError(f"malformed data reference {i}: bad holder {holder!r:.80}")
    addr, size = tree.get("address"), tree.get("size", 0)
    if addr is not None and (type(addr) is not str or len(addr) > 1024):
        raise ProtocolError(f"malformed data reference {i}: bad address")
    if type(size) is not int or size < 0:
        raise ProtocolError(f"malformed data reference {i}: bad size")
    reps = tree.get("replicas") or []
    if (type(reps) is not list or len(reps) > 64
            or not all(type(r) is list and len(r) == 2 and valid_name(r[0]) and type(r[1]) is str for r in reps)):
        raise ProtocolError(f"malformed data reference {i}: bad replicas")
    desc = {"__t": "ref", "id": i, "holder": holder, "address": addr, "size": size,
            "mode": str(tree.get("mode") or "persistent"), "replicas": reps, "call": tree.get("call") is True}
    if "value" in tree:
        return RefTag(desc, decode_value(tree["value"]))
    return RefTag(desc)


def light_ref(desc: dict) -> dict:
    """What a discovery carries about a reference: where it is and its size."""
    # size 0: a pending result of unknown size; counted as 1 byte so that its holder still wins ties
    return {"type": "ref", "id": desc["id"], "size": max(1, int(desc.get("size") or 0)), "mode": desc.get("mode"),
            "holders": [desc["holder"], *(r[0] for r in desc.get("replicas") or [])]}


def refs_in_light(args: Any) -> list[dict]:
    """The light references among a discovery's ``args``."""
    out = []
    for a in args if isinstance(args, list) else []:
        if isinstance(a, dict) and a.get("type") == "ref" and isinstance(a.get("holders"), list):
            out.append(a)
    return out


def fetch_bytes(args_light: Any, here: set[str], held: Callable[[str], bool] = lambda i: False) -> int:
    """Bytes a server would have to fetch to run a request with these light
    ``args``: zero for references it (``here``: its element names) or its
    process (``held``) holds."""
    total = 0
    for r in refs_in_light(args_light):
        size = r.get("size")
        if type(size) is not int or size < 0:
            continue
        if here.intersection(h for h in r["holders"] if isinstance(h, str)) or held(str(r.get("id"))):
            continue
        total += size
    return total


def find_refs(value: Any, out: list | None = None) -> list[RefTag]:
    """Every :class:`RefTag` inside a decoded value (lists, tuples, dicts)."""
    out = [] if out is None else out
    t = type(value)
    if t is RefTag:
        out.append(value)
    elif t is list or t is tuple:
        for v in value:
            find_refs(v, out)
    elif t is dict:
        for k, v in value.items():
            find_refs(v, out)
    return out


def substitute(value: Any, values: dict[int, Any]) -> Any:
    """``value`` with each :class:`RefTag` replaced by ``values[id(tag)]``."""
    t = type(value)
    if t is RefTag:
        return values[id(value)]
    if t is list:
        return [substitute(v, values) for v in value]
    if t is tuple:
        return tuple(substitute(v, values) for v in value)
    if t is dict:
        return {k: substitute(v, values) for k, v in value.items()}
    return value
