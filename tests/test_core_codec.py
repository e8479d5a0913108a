"""Pure tests of the value codec (gridrpc.core.codec): every supported type
comes back exactly as sent through a real JSON header (orjson) and bytes
frames; refused values raise InvalidArgument; malformed trees ProtocolError."""
import math

import numpy as np
import orjson
import pytest
from hypothesis import given, settings, strategies as st

from gridrpc.core import codec
from gridrpc.core.codec import FileRef, decode, encode, light_description
from gridrpc.errors import InvalidArgument, ProtocolError


def wire(value, file_reader=None, file_writer=None):
    """encode -> JSON bytes -> decode, buffers copied to bytes like zmq frames."""
    buffers: list = []
    tree = encode(value, buffers, file_reader)
    header = orjson.dumps({"value": tree})          # must be serialisable as a header
    frames = [bytes(memoryview(b)) for b in buffers]
    return decode(orjson.loads(header)["value"], frames, file_writer)


def same(a, b) -> bool:
    """Structural equality with exact types; floats compared by repr (nan, -0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, complex):
        return repr(a.real) == repr(b.real) and repr(a.imag) == repr(b.imag)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        if len(a) != len(b):
            return False
        # keys may hold nan: match by position (insertion order is kept)
        return all(same(ka, kb) and same(va, vb)
                   for (ka, va), (kb, vb) in zip(a.items(), b.items()))
    return a == b


# -- scalars and containers ---------------------------------------------------
@pytest.mark.parametrize("value", [
    0, 1, -1, 2**63 - 1, -2**63,                 # edges of the plain JSON range
    2**63, -2**63 - 1, 2**64, 10**40, -(10**40),  # beyond 64 bits
    0.0, -0.0, 1.5, 1e308, 5e-324, math.pi,
    math.inf, -math.inf, math.nan,
    1 + 2j, complex(math.inf, -math.nan), complex(0.0, -0.0),
    True, False, None, "", "héllo ✓", "__t",
    b"", b"\x00\xff" * 10,
])
def test_scalar_round_trip(value):
    assert same(wire(value), value)


def test_big_ints_travel_as_decimal_text():
    buffers: list = []
    assert encode(2**63 - 1, buffers) == 2**63 - 1
    assert encode(2**63, buffers) == {"__t": "i", "v": str(2**63)}
    assert encode(-2**63 - 1, buffers) == {"__t": "i", "v": str(-2**63 - 1)}
    assert buffers == []


def test_non_finite_floats_inside_nested_containers_stay_floats():
    value = {"a": [1.0, math.inf, [-math.inf, {"x": math.nan}]], "t": (math.nan, 2)}
    out = wire(value)
    assert same(out, value)
    assert type(out["a"][1]) is float and out["a"][1] == math.inf
    assert math.isnan(out["a"][2][1]["x"]) and type(out["a"][2][1]["x"]) is float
    assert type(out["t"]) is tuple and math.isnan(out["t"][0])


def test_bytes_like_values_come_back_as_bytes_via_buffers():
    for v in (b"abc", bytearray(b"abc"), memoryview(b"abc")):
        buffers: list = []
        tree = encode(v, buffers)
        assert tree == {"__t": "b", "i": 0} and len(buffers) == 1
        out = wire([v, v])
        assert out == [b"abc", b"abc"] and all(type(x) is bytes for x in out)


def test_tuples_nested_and_empty():
    value = ((), (1, (2, [3, (4,)])), [()])
    out = wire(value)
    assert same(out, value)
    assert type(out[1][1]) is tuple and type(out[1][1][1]) is list


def test_dicts_with_non_str_keys_and_with_a_tag_key():
    value = {1: "one", 2.5: "f", None: 0, True: "t", (1, "a"): [1], b"k": "bytes",
             "s": {"__t": "not a tag", "i": 0}}
    out = wire(value)
    assert same(out, value)
    assert out["s"] == {"__t": "not a tag", "i": 0}
    assert list(out) == list(value)                   # order kept
    buffers: list = []
    assert encode({"__t": "f", "v": "nan"}, buffers)["__t"] == "d"   # never mistaken for a tag
    assert wire({"__t": "f", "v": "nan"}) == {"__t": "f", "v": "nan"}


def test_plain_str_key_dict_stays_a_plain_json_object():
    buffers: list = []
    assert encode({"a": 1, "b": [2]}, buffers) == {"a": 1, "b": [2]}


def test_subclasses_of_containers_and_scalars_become_the_base_type():
    import collections
    import enum

    class Color(enum.IntEnum):
        RED = 3

    P = collections.namedtuple("P", "x y")
    out = wire([P(1, 2), collections.OrderedDict(a=1), Color.RED])
    assert out == [(1, 2), {"a": 1}, 3]
    assert type(out[0]) is tuple and type(out[1]) is dict and type(out[2]) is int


def test_file_values_with_reader_and_writer():
    class F:
        __gridrpc_file__ = True

        def __init__(self, name, data):
            self.name, self.data = name, data

    reader = lambda f: FileRef(name=f.name, data=f.data)   # noqa: E731
    out = wire({"f": F("in.txt", b"content")}, file_reader=reader)
    assert out["f"] == FileRef(name="in.txt", data=b"content")
    got = wire([F("a.bin", b"\x01\x02")], file_reader=reader,
               file_writer=lambda ref: ("written", ref.name, bytes(ref.data)))
    assert got == [("written", "a.bin", b"\x01\x02")]
    with pytest.raises(InvalidArgument):          # no reader: a file object is just an object
        encode(F("x", b""), [])


# -- numpy ------------------------------------------------------------------
DTYPES = ["i1", "u1", "<i2", ">i2", "<i4", ">i4", "<i8", ">i8", "<u2", ">u4", "<u8", ">u8",
          "<f2", ">f2", "<f4", ">f4", "<f8", ">f8", "<c8", ">c8", "<c16", ">c16", "?",
          "S5", "<U3", ">U3", "V4", "<M8[s]", ">M8[ns]", "<m8[ms]"]


def sample(dtype: str, shape=(3, 4)):
    dt = np.dtype(dtype)
    n = int(np.prod(shape))
    if dt.kind in "iu":
        base = np.arange(n) % 100
    elif dt.kind == "f":
        base = np.linspace(-3.5, 7.25, n)
    elif dt.kind == "c":
        base = np.linspace(-1, 1, n) + 1j * np.arange(n)
    elif dt.kind == "b":
        base = np.arange(n) % 3 == 0
    elif dt.kind == "S":
        base = np.array([b"ab%d" % i for i in range(n)])
    elif dt.kind == "U":
        base = np.array(["é%d" % (i % 10) for i in range(n)])
    elif dt.kind == "V":
        return np.frombuffer(bytes(range(n * dt.itemsize)), dtype=dt).reshape(shape).copy()
    elif dt.kind in "Mm":
        base = np.arange(n).astype(dt.newbyteorder("="))
    return base.astype(dt).reshape(shape)


def assert_same_array(out, a):
    assert type(out) is np.ndarray
    assert out.dtype == a.dtype and out.dtype.str == a.dtype.str   # byte order included
    assert out.shape == a.shape
    assert out.tobytes() == a.tobytes()          # same values, bit for bit (C order)
    assert out.flags.writeable                     # a private copy, not the frame


@pytest.mark.parametrize("dtype", DTYPES)
def test_array_round_trip_keeps_dtype_and_byte_order(dtype):
    a = sample(dtype)
    assert_same_array(wire(a), a)


def test_float_array_with_non_finite_values():
    a = np.array([[np.nan, np.inf], [-np.inf, -0.0]], dtype=">f8")
    out = wire(a)
    assert out.dtype.str == ">f8"
    assert np.isnan(out[0, 0]) and out[0, 1] == np.inf and out[1, 0] == -np.inf
    assert math.copysign(1.0, out[1, 1]) == -1.0


def test_structured_arrays_keep_their_fields():
    dt = np.dtype([("a", "<f8", (2,)), ("n", [("x", ">i4"), ("y", "<U2")]), ("c", "?")])
    a = np.zeros(3, dtype=dt)
    a["a"] = [[1, 2], [3, 4], [5, 6]]
    a["n"]["x"] = [7, 8, 9]
    a["n"]["y"] = ["p", "q", "r"]
    a["c"] = [True, False, True]
    out = wire(a)
    assert out.dtype == dt and out.dtype.names == ("a", "n", "c")
    assert out.tobytes() == a.tobytes()
    padded = np.dtype({"names": ["a", "b"], "formats": ["<i2", ">f8"], "offsets": [0, 8],
                       "itemsize": 24})
    b = np.zeros(2, dtype=padded)
    b["b"] = [1.5, -2.5]
    out = wire(b)
    assert out.dtype == padded and out.dtype.itemsize == 24
    assert list(out["b"]) == [1.5, -2.5]


def test_fortran_order_array_kept_and_sent_without_copy():
    a = np.asfortranarray(np.arange(12, dtype="<i4").reshape(3, 4))
    buffers: list = []
    tree = encode(a, buffers)
    assert tree["order"] == "F" and tree["shape"] == [3, 4] and tree["dtype"] == "<i4"
    assert np.shares_memory(np.frombuffer(buffers[0], dtype=np.uint8), a)    # zero copy
    out = wire(a)
    assert_same_array(out, a)
    assert out.flags.f_contiguous


def test_c_contiguous_array_is_zero_copy():
    a = np.ones((300, 300))
    buffers: list = []
    encode(a, buffers)
    assert isinstance(buffers[0], memoryview) and buffers[0].nbytes == a.nbytes
    assert np.shares_memory(np.frombuffer(buffers[0], dtype=np.uint8), a)


@pytest.mark.parametrize("view", [
    lambda a: a[::2, 1:],
    lambda a: a[:, ::-1],
    lambda a: a[::-1, ::3],
    lambda a: a.T[1:, :],
    lambda a: a[1],                 # a row: contiguous
    lambda a: a[:, 2],              # a column: strided
])
def test_non_contiguous_slices(view):
    base = np.arange(5 * 6, dtype=">f4").reshape(5, 6)
    a = view(base)
    assert_same_array(wire(a), a)


@pytest.mark.parametrize("a", [
    np.array(5.5), np.array(3, dtype=">i2"), np.array(True), np.array(b"xy"),
    np.array(1 + 2j, dtype="<c8"),
])
def test_zero_d_arrays_stay_zero_d_arrays(a):
    out = wire(a)
    assert type(out) is np.ndarray and out.ndim == 0 and out.shape == ()
    assert out.dtype.str == a.dtype.str and out[()] == a[()]


@pytest.mark.parametrize("shape", [(0,), (0, 3), (4, 0, 2), (0, 0)])
@pytest.mark.parametrize("dtype", ["<f8", ">i4", "?", "S3", "<M8[s]"])
def test_empty_arrays(shape, dtype):
    a = np.zeros(shape, dtype=dtype)
    buffers: list = []
    encode(a, buffers)
    assert len(buffers[0]) == 0
    assert_same_array(wire(a), a)
    assert_same_array(wire(np.asfortranarray(a)), a)


@pytest.mark.parametrize("scalar", [
    np.float64(1.25), np.float32(-2.5), np.float16(0.5), np.int8(-7), np.uint64(2**64 - 1),
    np.int64(-2**63), np.bool_(True), np.complex64(1 - 1j), np.complex128(complex(np.inf, 1)),
    np.datetime64("2020-01-02T03:04:05"), np.timedelta64(7, "ms"), np.bytes_(b"ab"),
    np.str_("zé"),
])
def test_numpy_scalars_keep_their_type(scalar):
    out = wire(scalar)
    assert type(out) is type(scalar)
    assert out.dtype == scalar.dtype and out == scalar


def test_numpy_nan_scalar_keeps_type_and_nan():
    out = wire([np.float32("nan"), np.float64("-inf")])
    assert type(out[0]) is np.float32 and np.isnan(out[0])
    assert type(out[1]) is np.float64 and out[1] == -np.inf


def test_arrays_inside_containers_use_separate_buffers():
    a, b = np.arange(3), np.eye(2, dtype="<f4")
    buffers: list = []
    tree = encode({"x": [a, b"raw", (b,)]}, buffers)
    assert len(buffers) == 3
    assert [tree["x"][0]["i"], tree["x"][1]["i"], tree["x"][2]["v"][0]["i"]] == [0, 1, 2]
    out = wire({"x": [a, b"raw", (b,)]})
    assert np.array_equal(out["x"][0], a) and out["x"][1] == b"raw"
    assert np.array_equal(out["x"][2][0], b) and out["x"][2][0].dtype == np.float32


def test_decode_accepts_memoryview_and_bytearray_frames():
    a = np.arange(6, dtype=">i8").reshape(2, 3)
    buffers: list = []
    tree = encode(a, buffers)
    for frame in (memoryview(bytes(buffers[0])), bytearray(buffers[0])):
        out = decode(tree, [frame])
        assert np.array_equal(out, a) and out.dtype.str == ">i8"


# -- refused values ------------------------------------------------------------
@pytest.mark.parametrize("value", [
    np.array([1, "a", None], dtype=object),
    np.array([], dtype=object),
    np.zeros(2, dtype=[("a", "<f8"), ("o", "O")]),
    {1, 2}, frozenset({1}), object(), lambda: 1, range(3), Ellipsis,
    [1, {"nested": {2}}], {"k": (object(),)}, {frozenset(): 1},
])
def test_unsupported_values_are_refused_with_invalid_argument(value):
    with pytest.raises(InvalidArgument):
        encode(value, [])


def test_invalid_argument_message_names_the_type():
    with pytest.raises(InvalidArgument, match="set"):
        encode({1}, [])
    with pytest.raises(InvalidArgument, match="object"):
        encode(np.array([None], dtype=object), [])
    assert issubclass(InvalidArgument, TypeError)


# -- malformed trees -----------------------------------------------------------
@pytest.mark.parametrize("tree, buffers", [
    ({"__t": "zz"}, []),                                       # unknown tag
    ({"__t": "b", "i": 0}, []),                                # missing buffer
    ({"__t": "b", "i": 3}, [b"x"]),                            # index out of range
    ({"__t": "b"}, [b"x"]),                                    # no index at all
    ({"__t": "b", "i": "0"}, [b"x"]),                          # index not an int
    ({"__t": "nd", "i": 0, "dtype": "<f8", "shape": [2]}, []),  # missing buffer
    ({"__t": "nd", "i": 0, "dtype": "<f8", "shape": [3]}, [b"\0" * 16]),   # wrong size
    ({"__t": "nd", "i": 0, "dtype": "nonsense", "shape": [1]}, [b"\0" * 8]),
    ({"__t": "nd", "i": 0, "dtype": "|O", "shape": [1]}, [b"\0" * 8]),     # object refused
    ({"__t": "nd", "i": 0, "dtype": "<f8"}, [b"\0" * 8]),       # no shape
    ({"__t": "nd", "i": 0, "dtype": "|V8", "shape": [1], "descr": 5}, [b"\0" * 8]),
    ({"__t": "nd", "i": 0, "dtype": "|V8", "shape": [1], "descr": [["a"]]}, [b"\0" * 8]),
    ({"__t": "nd", "i": 0, "dtype": "|V8", "shape": [1], "descr": [["a", "zz"]]}, [b"\0" * 8]),
    ({"__t": "nd", "i": 0, "dtype": "|V8", "shape": [1], "descr": [["a", "|O"]]}, [b"\0" * 8]),
    ({"__t": "ns", "i": 0, "dtype": "<f8", "shape": []}, [b"\0" * 3]),
    ({"__t": "f"}, []),
    ({"__t": "f", "v": "not a float"}, []),
    ({"__t": "i", "v": "12x"}, []),
    ({"__t": "c", "re": 1.0}, []),
    ({"__t": "t"}, []),
    ({"__t": "t", "v": 5}, []),
    ({"__t": "d", "v": [[1, 2, 3]]}, []),                      # not pairs
    ({"__t": "d", "v": [[{"a": 1}, 2]]}, []),                  # unhashable key
    ({"__t": "file", "i": 0}, [b"x"]),                         # no name
    ([1, {"deep": {"__t": "nope"}}], []),                      # nested
])
def test_malformed_trees_raise_protocol_error(tree, buffers):
    with pytest.raises(ProtocolError):
        decode(tree, buffers)


def test_protocol_error_names_the_tag():
    with pytest.raises(ProtocolError, match="'zz'"):
        decode({"__t": "zz"}, [])
    with pytest.raises(ProtocolError, match="'b'"):
        decode({"__t": "b", "i": 1}, [b""])


# -- light description -------------------------------------------------------
def test_light_description_keeps_scalars_and_summarises_big_values():
    assert light_description(None) is None
    assert light_description(True) is True
    assert light_description(42) == 42
    assert light_description(2.5) == 2.5
    assert light_description(math.inf) == "inf"
    assert light_description(-math.inf) == "-inf"
    assert light_description(math.nan) == "nan"
    assert light_description("short") == "short"
    assert light_description("x" * 64) == "x" * 64
    assert light_description("x" * 65) == {"type": "str", "len": 65}
    assert light_description(b"abc") == {"type": "bytes", "size": 3}
    assert light_description(bytearray(10)) == {"type": "bytes", "size": 10}
    assert light_description(np.zeros((2, 3), dtype=">f4")) == \
        {"type": "ndarray", "dtype": ">f4", "shape": [2, 3]}
    assert light_description([1, 2, 3]) == {"type": "list", "len": 3}
    assert light_description((1,)) == {"type": "tuple", "len": 1}
    assert light_description({"a": 1}) == {"type": "dict", "len": 1}
    assert light_description(1 + 2j) == {"type": "complex"}


@pytest.mark.parametrize("value", [
    None, 1, -2**63, 2**63, 2**200, -(2**100), 1.5, math.nan, math.inf, "s", "x" * 500, b"b",
    [1, 2], (), {"k": 1}, {1: 2}, 1j, np.zeros(3), np.float32(1.0), np.int64(3), {1, 2}, object(),
])
def test_light_description_is_always_a_valid_header_value(value):
    orjson.dumps({"args": [light_description(value)]})    # raises if not serialisable


def test_light_description_of_a_huge_int_is_small():
    d = light_description(10**5000)
    assert len(orjson.dumps(d)) < 200


# -- property ----------------------------------------------------------------
scalars = (st.none() | st.booleans() | st.integers() | st.text(max_size=20)
           | st.floats(allow_nan=True, allow_infinity=True)
           | st.complex_numbers(allow_nan=True, allow_infinity=True)
           | st.binary(max_size=40))
keys = st.text(max_size=8) | st.just("__t") | st.integers() | st.none() | st.booleans()
values = st.recursive(
    scalars,
    lambda children: (st.lists(children, max_size=5)
                      | st.lists(children, max_size=4).map(tuple)
                      | st.dictionaries(st.text(max_size=8) | st.just("__t"), children, max_size=4)
                      | st.dictionaries(keys, children, max_size=4)),
    max_leaves=20)


@settings(max_examples=80, deadline=None)
@given(values)
def test_property_round_trip_of_nested_values(value):
    assert same(wire(value), value)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["<i2", ">i4", "<u8", ">f8", "<f4", ">c16", "?", "S2"]),
       st.lists(st.integers(0, 4), min_size=0, max_size=3),
       st.booleans(), st.integers(1, 3))
def test_property_arrays_any_shape_order_and_stride(dtype, shape, fortran, step):
    a = sample(dtype, tuple(shape))
    if fortran:
        a = np.asfortranarray(a)
    if a.ndim:
        a = a[::step]
    assert_same_array(wire(a), a)


def test_module_constant_matches_json_int_range():
    assert codec._INT_MAX == 2**63 - 1
