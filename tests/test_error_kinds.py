"""One table maps wire error kinds to exceptions and back (gridrpc.errors):
every GridRPCError subclass is answered with a kind that turns back into the
same class on the client, and every kind answered anywhere is in the table."""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import gridrpc
import gridrpc.errors as errors
from gridrpc.errors import (ERROR_KINDS, KIND_OF, DataAccessDenied, DataError, DataLost, GridRPCError, InvalidArgument,
                            ProtocolError, RemoteError, ResultGone, ServerLost, error_from_wire, kind_of, wire_kind)

ROOT = Path(gridrpc.__file__).parent


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def _make(cls: type) -> GridRPCError:
    if issubclass(cls, RemoteError):
        return cls("boom", remote_type="ValueError", remote_traceback="tb")
    if issubclass(cls, ServerLost):
        return cls("gone", server="s1", call_id="c1")
    return cls("boom")


DEFINED_HERE = [c for c in [GridRPCError, *_subclasses(GridRPCError)] if c.__module__ == "gridrpc.errors"]


@pytest.mark.parametrize("cls", DEFINED_HERE, ids=lambda c: c.__name__)
def test_every_error_class_round_trips_through_its_wire_kind(cls):
    exc = _make(cls)
    kind = wire_kind(exc)
    assert ERROR_KINDS[kind] is cls and KIND_OF[cls] == kind
    back = error_from_wire({"kind": kind, "message": "boom", "type": "ValueError", "traceback": "tb",
                            "call_id": "c1"}, server="s1")
    assert type(back) is cls and back.kind == kind
    if isinstance(back, RemoteError):
        assert back.remote_type == "ValueError" and back.remote_traceback == "tb" and back.server == "s1"
    if isinstance(back, ServerLost):
        assert back.call_id == "c1" and back.server == "s1"


def _modules_defining_errors() -> list[str]:
    """Modules with a class deriving from one of gridrpc.errors' classes (by name)."""
    names = {c.__name__ for c in DEFINED_HERE}
    out = []
    for path in ROOT.rglob("*.py"):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.ClassDef) and any(getattr(b, "id", getattr(b, "attr", None)) in names
                                                   for b in n.bases) for n in ast.walk(tree)):
            out.append(".".join(path.relative_to(ROOT.parent).with_suffix("").parts))
    return out


def test_errors_of_other_modules_travel_as_their_nearest_table_class():
    for name in _modules_defining_errors():
        if name != "gridrpc.errors":
            try:
                importlib.import_module(name)
            except ImportError:                  # an optional extra not installed here
                pass
    others = [c for c in _subclasses(GridRPCError) if c.__module__ != "gridrpc.errors"]
    assert others, "no GridRPCError subclass outside gridrpc.errors was found"
    for cls in others:
        base = next(b for b in cls.__mro__ if b in KIND_OF)
        kind = wire_kind(cls.__new__(cls))
        assert kind == KIND_OF[base] and isinstance(error_from_wire({"kind": kind, "message": "m"}), base)


def test_the_table_has_every_kind_once_and_each_class_a_first_kind():
    assert set(KIND_OF) == set(ERROR_KINDS.values())
    assert KIND_OF[GridRPCError] == "internal" and wire_kind(RuntimeError("bug")) == "internal"
    assert KIND_OF[ResultGone] == "result_gone"
    for kind in ("no_acceptable_server", "rebuilding", "busy"):        # read only, never answered
        assert KIND_OF[ERROR_KINDS[kind]] == "no_server"
    assert KIND_OF[ERROR_KINDS["peer_unreachable"]] == "communication"


def test_unknown_and_odd_kinds_give_the_root():
    e = error_from_wire({"kind": "from_a_newer_version", "message": "m"})
    assert type(e) is GridRPCError and e.kind == "from_a_newer_version"
    e = error_from_wire({"kind": 7, "message": "m"})
    assert type(e) is GridRPCError and e.kind == "remote"
    assert type(error_from_wire({"message": "m"})) is RemoteError


def test_kind_of_keeps_the_answered_kind_and_calls_bugs_remote():
    assert kind_of(error_from_wire({"kind": "rebuilding", "message": "m"})) == "rebuilding"
    assert kind_of(DataLost("x")) == "data_lost" and kind_of(KeyError("x")) == "remote"


def _kind_literals() -> set[str]:
    """Kinds written as literals where errors are answered: error_header(id, KIND, ...),
    reply_error(msg, KIND, ...), Outcome(kind=KIND)."""
    found = set()
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            pos = {"error_header": 1, "reply_error": 1}.get(name)
            args = list(node.args)
            if pos is not None and len(args) > pos and isinstance(args[pos], ast.Constant):
                found.add(args[pos].value)
            if name in ("Outcome", "DiscoveryFailed", "CallError"):
                for kw in node.keywords:
                    if kw.arg == "kind" and isinstance(kw.value, ast.Constant):
                        found.add(kw.value.value)
                if name == "DiscoveryFailed" and args and isinstance(args[0], ast.Constant):
                    found.add(args[0].value)
    return found


def test_every_kind_answered_in_the_code_is_in_the_table():
    found = _kind_literals()
    assert {"result_gone", "internal", "busy", "protocol"} <= found        # the scan sees them
    assert found <= set(ERROR_KINDS), sorted(found - set(ERROR_KINDS))


def test_data_errors_are_answered_with_their_kinds():
    assert [wire_kind(e) for e in (DataError("x"), DataLost("x"), DataAccessDenied("x"))] == \
        ["data", "data_lost", "data_denied"]
    assert [wire_kind(e) for e in (ProtocolError("x"), InvalidArgument("x"))] == ["protocol", "invalid_argument"]
    assert errors.ERROR_KINDS is ERROR_KINDS


def test_the_architecture_doc_lists_every_kind():
    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    para = doc[doc.index("An `error` reply's `kind`"):]
    para = para[:para.index("\n\n")]
    listed = set(re.findall(r"`([a-z_]+)`", para))
    assert set(ERROR_KINDS) <= listed, sorted(set(ERROR_KINDS) - listed)
