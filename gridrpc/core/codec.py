"""Value codec: Python values <-> (JSON-able tree, list of binary buffers).

No pickle on the wire. Scalars and containers become JSON; anything binary
(bytes, numpy arrays, file contents) becomes an extra frame and the tree keeps
a small descriptor ``{"__t": kind, "i": buffer index, ...}``. Tags:

==========  ==========================================================
``f``       non-finite float (``inf``, ``-inf``, ``nan``) — orjson would write null
``i``       integer beyond 64 bits (as a decimal string)
``c``       complex (``re``, ``im`` each encoded like a float)
``b``       bytes / bytearray / memoryview (buffer)
``nd``      numpy array: ``dtype`` (``dtype.str``, byte order kept; structured: also ``descr``), ``shape``, buffer
``ns``      numpy scalar (a 0-d array read back with ``[()]``)
``file``    a :class:`File`: ``name`` and the content as a buffer
``t``       tuple
``d``       dict whose keys are not all strings, or that holds the key ``__t``
``ref``     a data reference held on a SeD (:mod:`gridrpc.core.refs`): ``id``, ``holder``,
            ``address``, ``size``, ``mode``; decoded as :class:`~gridrpc.core.refs.RefTag`
==========  ==========================================================

Object arrays, sets, arbitrary objects are refused with
:class:`~gridrpc.errors.InvalidArgument`.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import InvalidArgument, ProtocolError

# numpy is imported by the paths that meet an array, not here (it costs more
# than the rest of a client's start): a value can only be a numpy array if
# numpy is already in ``sys.modules``, and decoding an array imports it.

_INT_MAX = (1 << 63) - 1
#: the JSON scalars: :func:`decode` gives each back as itself
_PLAIN = frozenset({int, float, str, bool, type(None)})


@dataclass(frozen=True, slots=True)
class FileRef:
    """A file on the wire: its base name and content. The runtime turns it into
    a :class:`gridrpc.File` pointing to a local copy."""
    name: str
    data: bytes | memoryview


def encode(value: Any, buffers: list, file_reader: Callable[[Any], FileRef] | None = None) -> Any:
    """Encode ``value`` into a JSON-able tree, appending binary parts to ``buffers``."""
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if t is int:
        if -_INT_MAX - 1 <= value <= _INT_MAX:
            return value
        return {"__t": "i", "v": str(value)}
    if t is float:
        return value if math.isfinite(value) else {"__t": "f", "v": repr(value)}
    if t is list:
        return [encode(v, buffers, file_reader) for v in value]
    if t is dict:
        if all(type(k) is str for k in value) and "__t" not in value:
            return {k: encode(v, buffers, file_reader) for k, v in value.items()}
        return {"__t": "d", "v": [[encode(k, buffers, file_reader), encode(v, buffers, file_reader)]
                                  for k, v in value.items()]}
    if t is tuple:
        return {"__t": "t", "v": [encode(v, buffers, file_reader) for v in value]}
    if t is complex:
        return {"__t": "c", "re": encode(value.real, buffers), "im": encode(value.imag, buffers)}
    if t in (bytes, bytearray, memoryview):
        buffers.append(value)
        return {"__t": "b", "i": len(buffers) - 1}
    np = sys.modules.get("numpy")     # an array (or subclass) exists only once numpy is imported
    if np is not None:
        if isinstance(value, np.ndarray):
            return _encode_array(np, value, buffers, "nd")
        if isinstance(value, np.generic):
            return _encode_array(np, np.asarray(value), buffers, "ns")
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return encode(int(value), buffers)
    if isinstance(value, float):
        return encode(float(value), buffers)
    if isinstance(value, str):
        return str(value)
    ref = getattr(value, "__gridrpc_ref__", None)
    if ref is not None:                 # a DataRef / RefTag: its descriptor (the bytes stay on the SeD)
        return ref()
    if file_reader is not None and getattr(value, "__gridrpc_file__", False):
        ref = file_reader(value)
        buffers.append(ref.data)
        return {"__t": "file", "name": ref.name, "i": len(buffers) - 1}
    if isinstance(value, (list, tuple, dict)):
        base = list if isinstance(value, list) else tuple if isinstance(value, tuple) else dict
        return encode(base(value), buffers, file_reader)   # subclasses (namedtuple, OrderedDict)
    raise InvalidArgument(f"cannot send a value of type {t.__module__}.{t.__qualname__}; "
                          "supported: int, float, complex, bool, str, bytes, None, lists, tuples, "
                          "dicts, numpy arrays and gridrpc.File")


def _encode_array(np, arr, buffers: list, tag: str) -> dict:
    if arr.dtype.hasobject:
        raise InvalidArgument("numpy arrays of dtype object cannot be sent (no pickle on the wire)")
    if arr.flags.c_contiguous:
        order, data = "C", arr
    elif arr.flags.f_contiguous:
        order, data = "F", arr
    else:
        order, data = "C", np.ascontiguousarray(arr)
    flat = data.reshape(-1, order="A") if data.ndim else data.reshape(1)
    # a uint8 view, not memoryview(flat): numpy refuses the buffer protocol for
    # datetime64/timedelta64, and a structured format string is not castable
    buffers.append(memoryview(flat.view(np.uint8)) if data.size else b"")
    out = {"__t": tag, "i": len(buffers) - 1, "dtype": arr.dtype.str,
           "shape": list(arr.shape), "order": order}
    if arr.dtype.names is not None:      # structured: dtype.str ("|V12") would lose the fields
        out["descr"] = np.lib.format.dtype_to_descr(arr.dtype)
    return out


def _descr(d):
    """A structured dtype description back from JSON (lists) to numpy's tuples."""
    if isinstance(d, str):
        return d
    out = []
    for f in d:
        name, typ, *shape = f
        out.append((tuple(name) if isinstance(name, list) else name, _descr(typ),
                    *(tuple(s) for s in shape)))
    return out


def decode(tree: Any, buffers: list, file_writer: Callable[[FileRef], Any] | None = None,
           copy: bool = True) -> Any:
    """Inverse of :func:`encode`. ``buffers`` are bytes-like objects (zmq frames' buffers).
    ``copy=False`` returns arrays as views on the buffers (no copy; writable
    if the buffer is). An array's shape and dtype must fill its buffer exactly."""
    t = type(tree)
    if t is list:
        for v in tree:
            if type(v) not in _PLAIN:
                return [decode(v, buffers, file_writer, copy) for v in tree]
        return list(tree)           # scalars only (the usual arguments): each decodes to itself
    if t is not dict:
        return tree
    tag = tree.get("__t")
    if tag is None:
        for v in tree.values():
            if type(v) not in _PLAIN:
                return {k: decode(v, buffers, file_writer, copy) for k, v in tree.items()}
        return dict(tree)
    try:
        if tag == "f":
            return float(tree["v"])
        if tag == "i":
            return int(tree["v"])
        if tag == "c":
            return complex(decode(tree["re"], buffers), decode(tree["im"], buffers))
        if tag == "t":
            return tuple(decode(v, buffers, file_writer, copy) for v in tree["v"])
        if tag == "d":
            return {_hashable(decode(k, buffers, file_writer, copy)): decode(v, buffers, file_writer, copy)
                    for k, v in tree["v"]}
        if tag == "b":
            return bytes(buffers[_index(tree)])
        if tag in ("nd", "ns"):
            np = _numpy()
            dtype = (np.lib.format.descr_to_dtype(_descr(tree["descr"])) if "descr" in tree
                     else np.dtype(tree["dtype"]))
            if dtype.hasobject:
                raise ProtocolError("object arrays are refused")
            shape = _shape(tree["shape"])
            buf = buffers[_index(tree)]
            count = math.prod(shape)
            nbytes = memoryview(buf).nbytes
            if count * dtype.itemsize != nbytes:    # the view never reaches past the frame
                raise ProtocolError(f"array of shape {shape} and dtype {dtype.str} needs "
                                    f"{count * dtype.itemsize} bytes, its frame has {nbytes}")
            arr = np.frombuffer(buf, dtype=dtype, count=count) if count else np.empty(0, dtype)
            arr = arr.reshape(shape, order=tree.get("order", "C"))
            if copy or tag == "ns":   # copy=False: a view on the frame (the SeD hands it to a worker)
                arr = arr.copy(order="K")
            return arr[()] if tag == "ns" else arr
        if tag == "ref":
            from .refs import decode_ref
            return decode_ref(tree, lambda t: decode(t, buffers, file_writer, copy))
        if tag == "file":
            ref = FileRef(name=str(tree["name"]), data=buffers[_index(tree)])
            return file_writer(ref) if file_writer else ref
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed encoded value with tag {tag!r}: {exc}") from exc
    raise ProtocolError(f"unknown value tag {tag!r}")


def _numpy():
    """numpy, for decoding an array (imported on the first one)."""
    try:
        import numpy
    except ImportError:     # pragma: no cover - numpy is a dependency
        raise ProtocolError("received a numpy array, but numpy is not installed here") from None
    return numpy


def _index(tree: dict) -> int:
    i = tree["i"]
    if type(i) is not int or i < 0:
        raise ValueError(f"buffer index must be a non-negative int, got {i!r}")
    return i


def _shape(shape) -> tuple[int, ...]:
    """An array's shape from a header: at most 64 dimensions (numpy's
    limit), each a non-negative int (no -1 to infer, no float, no bool)."""
    if (type(shape) is not list or len(shape) > 64
            or not all(type(s) is int and 0 <= s <= _INT_MAX for s in shape)):
        raise ProtocolError(f"an array's shape must be a list of at most 64 non-negative ints, got {shape!r}")
    return tuple(shape)


def _hashable(v):
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v


def light_description(value: Any) -> Any:
    """The 'light' form of an argument sent with a discovery request (as DIET
    does): scalars as themselves, big things only by type and size."""
    t = type(value)
    if t is int and not -_INT_MAX - 1 <= value <= _INT_MAX:    # would not fit in the JSON header
        return {"type": "int", "bits": value.bit_length()}
    if value is None or t in (bool, int, float, str) and (t is not str or len(value) <= 64):
        return value if t is not float or math.isfinite(value) else repr(value)
    ref = getattr(value, "__gridrpc_ref__", None)
    if ref is not None:
        from .refs import light_ref
        return light_ref(ref())
    np = sys.modules.get("numpy")     # an array (or subclass) exists only once numpy is imported
    if np is not None and isinstance(value, np.ndarray):
        return {"type": "ndarray", "dtype": value.dtype.str, "shape": list(value.shape)}
    if t in (bytes, bytearray, memoryview):
        return {"type": "bytes", "size": len(value)}
    if t in (list, tuple):
        return {"type": t.__name__, "len": len(value)}
    if t is dict:
        return {"type": "dict", "len": len(value)}
    if t is str:
        return {"type": "str", "len": len(value)}
    return {"type": t.__name__}
