"""Service table of a SeD: callables with their metadata, argument checks, and
loading ``module:function`` specs from the command line."""
from __future__ import annotations

import importlib
import inspect
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

import numbers

from ..core.refs import RefTag
from ..files import File, is_sent_file
from ..errors import ConfigError, InvalidArgument

_SIMPLE = {int: (numbers.Integral,), float: (numbers.Real,), str: (str,), bool: (bool,), bytes: (bytes,),
           complex: (numbers.Complex,), list: (list,), dict: (dict,), tuple: (tuple, list)}


@dataclass
class Service:
    name: str
    fn: Callable
    doc: str = ""
    params: list[dict] = field(default_factory=list)
    estimate: Callable[[dict, list], dict | None] | None = None
    signature: inspect.Signature | None = None
    aggregator: Any = None          # default aggregator for this service (name or spec)
    estimate_uses_args: bool | None = None  # None: True iff it has its own ``estimate``

    @property
    def pushed(self) -> bool:
        """Its estimation does not depend on a request's arguments: pushed to
        the parent, and discoveries may be answered from the view."""
        return self.estimate is None or self.estimate_uses_args is False
    idempotent: bool = True         # False: a call whose server died after it started is not re-run
    on_orphan: str = "auto"         # a running call whose client is gone: kill | finish | auto
    _fast: tuple | bool | None = field(default=None, repr=False, compare=False)   # see _fast_plan

    def describe(self) -> dict:
        d = {"name": self.name, "doc": self.doc, "params": self.params}
        if self.aggregator is not None:
            d["aggregator"] = self.aggregator
        if not self.idempotent:
            d["idempotent"] = False
        return d

    def orphan_policy(self) -> str:
        """What to do with a call whose client went away: ``kill`` it (an
        idempotent call can simply be run again) or let it ``finish`` and
        keep its result for a reconnecting client (``auto``: kill idempotent
        services, finish the others)."""
        if self.on_orphan in ("kill", "finish"):
            return self.on_orphan
        return "kill" if self.idempotent else "finish"

    def check(self, args: list, kwargs: dict) -> None:
        """Wrong number, names or types of arguments -> one InvalidArgument
        naming every problem, before queueing. A reference (a DataRef, a
        pending call) passes the type check here: the SeD checks again once
        it has the value (:mod:`gridrpc.sed.data.call_refs`)."""
        if self.signature is None:
            return
        fast = self._fast
        if fast is None:
            fast = self._fast = _fast_plan(self.signature)
        if fast and not kwargs and fast[0] <= len(args) <= len(fast[1]):
            # plain positional parameters given positionally (the common case): the
            # checks computed once per service; any problem -> the full path's message
            for value, (default_none, checker) in zip(args, fast[1]):
                if (checker is not None and not (value is None and default_none) and not checker[1](value)
                        and type(value) is not RefTag):
                    break
            else:
                return
        bound, problems = _bind(self.signature, args, kwargs)
        count_problems = bool(problems)
        params = self.signature.parameters
        for pname, value in bound.items():
            p = params[pname]
            if value is None and p.default is None:
                continue                      # `x: T = None`: None is the default, hence allowed
            checker = _checker(p.annotation)
            if checker is not None and not checker[1](value) and type(value) is not RefTag:
                problems.append(f"argument {pname!r} must be {checker[0]}, got {type(value).__name__} "
                                f"({value!r:.60})")
        if problems:
            head = f"{self.name}{self.signature}" if count_problems else self.name
            raise InvalidArgument(f"{head}: " + "; ".join(problems))


_P = inspect.Parameter


def _fast_plan(sig: inspect.Signature) -> tuple | bool:
    """For a signature of plain positional-or-keyword parameters:
    ``(required count, [(default is None, checker) per parameter])``; else
    False (``check`` then always takes the full path)."""
    params = list(sig.parameters.values())
    if any(p.kind is not _P.POSITIONAL_OR_KEYWORD for p in params):
        return False
    required = sum(1 for p in params if p.default is _P.empty)
    if any(p.default is _P.empty for p in params[required:]):
        return False
    return required, [(p.default is None, _checker(p.annotation)) for p in params]


def _bind(sig: inspect.Signature, args: list, kwargs: dict) -> tuple[dict, list[str]]:
    """Like ``Signature.bind`` but collecting every problem instead of
    stopping at the first; returns (bound named arguments, problems)."""
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)]
    var_pos = any(p.kind is _P.VAR_POSITIONAL for p in params)
    var_kw = any(p.kind is _P.VAR_KEYWORD for p in params)
    bound: dict[str, Any] = {}
    problems: list[str] = []
    if len(args) > len(positional) and not var_pos:
        problems.append(f"too many positional arguments ({len(args)} given, at most {len(positional)})")
    for p, value in zip(positional, args):
        bound[p.name] = value
    by_name = sig.parameters
    for key, value in kwargs.items():
        p = by_name.get(key)
        if p is None or p.kind in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD):
            if not var_kw:
                problems.append(f"got an unexpected keyword argument {key!r}")
        elif p.kind is _P.POSITIONAL_ONLY:
            if not var_kw:
                problems.append(f"positional-only argument {key!r} passed as a keyword argument")
        elif key in bound:
            problems.append(f"multiple values for argument {key!r}")
        else:
            bound[key] = value
    for p in params:
        if p.default is _P.empty and p.name not in bound:
            if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD):
                problems.append(f"missing a required argument: {p.name!r}")
            elif p.kind is _P.KEYWORD_ONLY:
                problems.append(f"missing a required keyword-only argument: {p.name!r}")
    return bound, problems


def _checker(ann: Any) -> tuple[str, Callable[[Any], bool]] | None:
    """(description, test) for the annotations we can check: int, float,
    complex, bool, str, bytes, list, dict, tuple, None, ``gridrpc.File``
    (a file sent with the call, never a path string), numpy arrays
    (``np.ndarray``, ``numpy.typing.NDArray[...]``) and unions of those.
    Anything else (``Any``, ``list[int]``, user classes, ...) is not checked."""
    if ann is None or ann is type(None):
        return "None", lambda v: v is None
    if ann is File:
        return "a gridrpc.File sent with the call", is_sent_file
    ok_types = _SIMPLE.get(ann) if isinstance(ann, type) else None
    if ok_types is not None:
        if ann in (int, float, complex):
            return ann.__name__, lambda v: isinstance(v, ok_types) and not isinstance(v, bool)
        return ann.__name__, lambda v: isinstance(v, ok_types)
    np = sys.modules.get("numpy")       # an array annotation means its module imported numpy
    if np is not None and ((isinstance(ann, type) and issubclass(ann, np.ndarray))
                           or typing.get_origin(ann) is np.ndarray):
        return "ndarray", lambda v: isinstance(v, np.ndarray)
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        parts = [_checker(a) for a in typing.get_args(ann)]
        if any(c is None for c in parts):
            return None
        parts.sort(key=lambda c: c[0] == "None")          # "int or None", not "None or int"
        tests = [c[1] for c in parts]
        return " or ".join(c[0] for c in parts), lambda v: any(t(v) for t in tests)
    return None


def make_service(name: str | None, fn: Callable, *, doc: str | None = None,
                 estimate: Callable | None = None, aggregator: Any = None) -> Service:
    if not callable(fn):
        raise ConfigError(f"service {name!r}: {fn!r} is not callable")
    try:
        sig = inspect.signature(fn, eval_str=True)   # resolve "int" under `from __future__ import annotations`
    except (TypeError, ValueError, NameError):
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None
    params = []
    if sig is not None:
        for p in sig.parameters.values():
            ann = p.annotation
            params.append({"name": p.name,
                           "type": getattr(ann, "__name__", str(ann)) if ann is not inspect.Parameter.empty else "any",
                           "default": None if p.default is inspect.Parameter.empty else repr(p.default),
                           "kind": p.kind.name.lower()})
    return Service(name=name or fn.__name__, fn=fn, doc=doc if doc is not None else (inspect.getdoc(fn) or ""),
                   params=params, estimate=estimate, signature=sig,
                   aggregator=aggregator if aggregator is not None else getattr(fn, "__gridrpc_aggregator__", None),
                   idempotent=getattr(fn, "__gridrpc_idempotent__", True) is not False,
                   on_orphan=str(getattr(fn, "__gridrpc_on_orphan__", "auto")))


ORPHAN_POLICIES = ("auto", "kill", "finish")


def split_spec_options(spec: str) -> tuple[str, dict]:
    """``[name=]module:func[,idempotent=false][,on_orphan=kill]`` -> (spec, options)."""
    head, *opts = spec.split(",")
    out: dict = {}
    for o in opts:
        key, sep, value = o.strip().partition("=")
        key, value = key.strip().replace("-", "_"), value.strip().lower()
        if key == "idempotent" and sep and value in ("true", "yes", "1", "false", "no", "0"):
            out["idempotent"] = value in ("true", "yes", "1")
        elif key == "on_orphan" and sep and value in ORPHAN_POLICIES:
            out["on_orphan"] = value
        else:
            raise ConfigError(f"service spec {spec!r}: unknown option {o!r} (idempotent=true|false, "
                              f"on_orphan={'|'.join(ORPHAN_POLICIES)})")
    return head, out


def load_spec(spec: str) -> Service:
    """``[name=]package.module:function`` -> Service."""
    name = None
    if "=" in spec:
        name, spec = spec.split("=", 1)
    if ":" not in spec:
        raise ConfigError(f"service spec {spec!r}: expected 'package.module:function' (optionally 'name=...')")
    mod, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(mod)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError, TypeError) as exc:   # "" / ".rel" module names
        raise ConfigError(f"cannot load service {spec!r}: {exc}") from exc
    estimate = getattr(obj, "__gridrpc_estimate__", None)
    return make_service(name or attr.split(".")[-1], obj, estimate=estimate)
