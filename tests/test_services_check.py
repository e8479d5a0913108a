"""Pure tests of a SeD's service table (gridrpc.sed.services): argument checks
before queueing (Service.check) and loading 'module:function' specs."""
import numpy as np
import pytest

from gridrpc.errors import ConfigError, InvalidArgument
from gridrpc.sed.services import Service, load_spec, make_service


def add(x: int, y: int) -> int:
    """Return x + y."""
    return x + y


def scale(v: float, factor: complex = 1, *, label: str = "", flag: bool = False):
    return v


def variadic(first: int, *rest: int, **opts: str):
    return first


def containers(a: list, d: dict, t: tuple, b: bytes):
    return a


def untyped(x, y=None, z: np.ndarray = None):
    return x


def stringly(x: "int", y: "float | None" = None):
    return x


def estimate_me(n: int):
    return n


estimate_me.__gridrpc_estimate__ = lambda vec, args: {"tcomp": 1.0}
not_callable = 42


def svc(fn):
    return make_service(None, fn)


# -- counts -------------------------------------------------------------------
@pytest.mark.parametrize("args, kwargs, message", [
    ([1], {}, "missing a required argument: 'y'"),
    ([], {}, "missing a required argument: 'x'"),
    ([1, 2, 3], {}, "too many positional arguments"),
    ([1], {"x": 2}, "multiple values for argument 'x'"),
    ([1, 2], {"z": 3}, "unexpected keyword argument 'z'"),
])
def test_wrong_argument_count_or_names(args, kwargs, message):
    with pytest.raises(InvalidArgument, match=message) as info:
        svc(add).check(args, kwargs)
    assert str(info.value).startswith("add(x: int, y: int)")      # says what was expected


def test_good_calls_pass():
    s = svc(add)
    s.check([1, 2], {})
    s.check([1], {"y": 2})
    s.check([], {"y": 2, "x": 1})
    s.check([2**80, -1], {})                                        # big ints are ints


# -- types ----------------------------------------------------------------------
@pytest.mark.parametrize("args", [["1", 2], [1.0, 2], [1, None], [1, b"2"], [1, [2]]])
def test_wrong_type_for_int(args):
    with pytest.raises(InvalidArgument, match="must be int, got"):
        svc(add).check(args, {})


@pytest.mark.parametrize("args", [[True, 2], [1, False]])
def test_bool_is_refused_for_an_int_parameter(args):
    with pytest.raises(InvalidArgument, match="must be int, got bool"):
        svc(add).check(args, {})


def test_message_names_the_argument_and_shows_the_value():
    with pytest.raises(InvalidArgument) as info:
        svc(add).check([1, "two"], {})
    assert "add: argument 'y' must be int, got str ('two')" in str(info.value)
    with pytest.raises(InvalidArgument) as info:
        svc(add).check([1, "x" * 500], {})
    assert len(str(info.value)) < 200                                # long values truncated


def test_float_and_complex_parameters():
    s = svc(scale)
    s.check([1.5], {})
    s.check([3], {})                                  # int accepted for float
    s.check([3, 2], {})                               # int accepted for complex
    s.check([3.0, 2.5], {})                           # float accepted for complex
    s.check([3.0, 1 + 2j], {})
    s.check([np.float64(2.0)], {})                    # numpy float64 is a float
    for bad in (["1.5"], [True], [1j], [None]):
        with pytest.raises(InvalidArgument, match="'v' must be float"):
            s.check(bad, {})
    with pytest.raises(InvalidArgument, match="'factor' must be complex, got bool"):
        s.check([1.0, True], {})


def test_keyword_only_parameters():
    s = svc(scale)
    s.check([1.0], {"label": "x", "flag": True})
    with pytest.raises(InvalidArgument, match="'label' must be str"):
        s.check([1.0], {"label": 5})
    with pytest.raises(InvalidArgument, match="'flag' must be bool, got int"):
        s.check([1.0], {"flag": 1})                   # an int is not a bool either
    with pytest.raises(InvalidArgument, match="too many positional"):
        s.check([1.0, 2.0, "label"], {})              # keyword-only cannot be positional


def test_star_args_and_star_kwargs():
    s = svc(variadic)
    s.check([1], {})
    s.check([1, 2, 3, "anything"], {"any": "thing", "n": 5})   # *rest/**opts not type-checked
    with pytest.raises(InvalidArgument, match="'first' must be int"):
        s.check(["1", 2], {})
    with pytest.raises(InvalidArgument, match="missing a required argument: 'first'"):
        s.check([], {"other": 1})


def test_container_and_bytes_parameters():
    s = svc(containers)
    s.check([[1], {"a": 1}, (1,), b"x"], {})
    s.check([[1], {"a": 1}, [1, 2], b"x"], {})      # a list is fine for a tuple (JSON has no tuples)
    with pytest.raises(InvalidArgument, match="'a' must be list"):
        s.check([(1,), {}, (), b""], {})
    with pytest.raises(InvalidArgument, match="'d' must be dict"):
        s.check([[], [], (), b""], {})
    with pytest.raises(InvalidArgument, match="'b' must be bytes"):
        s.check([[], {}, (), "text"], {})


def test_unannotated_and_other_annotations_are_not_checked():
    s = svc(untyped)
    s.check(["anything"], {})
    s.check([object(), 1, np.zeros(2)], {})
    s.check([object(), 1, None], {})                 # = its default (None)
    with pytest.raises(InvalidArgument, match="too many"):
        s.check([1, 2, 3, 4], {})


# -- every problem at once, ndarray annotations ------------------------------------
def test_missing_and_unexpected_are_reported_together():
    with pytest.raises(InvalidArgument) as info:
        svc(add).check([1], {"z": 2})
    msg = str(info.value)
    assert msg.startswith("add(x: int, y: int)")
    assert "missing a required argument: 'y'" in msg and "unexpected keyword argument 'z'" in msg


def test_every_type_problem_is_reported():
    with pytest.raises(InvalidArgument) as info:
        svc(add).check(["1", 2.5], {})
    msg = str(info.value)
    assert "'x' must be int, got str" in msg and "'y' must be int, got float" in msg


def test_count_and_type_problems_together():
    with pytest.raises(InvalidArgument) as info:
        svc(scale).check(["1.5"], {"flag": 1, "colour": "red"})
    msg = str(info.value)
    assert "unexpected keyword argument 'colour'" in msg
    assert "'v' must be float, got str" in msg and "'flag' must be bool, got int" in msg


def solve(a: np.ndarray, b: "np.ndarray | None" = None, *, c: "npt.NDArray[np.float64] | None" = None):
    return a


import numpy.typing as npt  # noqa: E402  (resolved lazily by the string annotations above)


def test_ndarray_annotations_are_checked():
    s = svc(solve)
    s.check([np.eye(2)], {})
    s.check([np.eye(2), np.ones(2)], {"c": np.ones(2)})
    s.check([np.zeros(()), None], {"c": None})           # 0-d arrays are arrays; None where allowed
    for bad in ("[[1, 0], [0, 1]]", [[1, 0], [0, 1]], 3.0, None):
        with pytest.raises(InvalidArgument, match="'a' must be ndarray"):
            s.check([bad], {})
    with pytest.raises(InvalidArgument, match="'b' must be ndarray or None, got str"):
        s.check([np.eye(2), "b"], {})
    with pytest.raises(InvalidArgument, match="'c' must be ndarray or None, got list"):
        s.check([np.eye(2)], {"c": [1.0]})


def test_unions_of_checkable_types():
    def f(x: "int | None", y: "float | str" = 0.0):
        return x
    s = svc(f)
    s.check([None], {})
    s.check([1, "s"], {})
    s.check([1, 2.5], {})
    with pytest.raises(InvalidArgument, match="'x' must be int or None, got str"):
        s.check(["1"], {})
    with pytest.raises(InvalidArgument, match="'y' must be float or str, got list"):
        s.check([1, [1]], {})


def test_string_annotations_are_resolved():
    s = svc(stringly)
    s.check([1], {})
    s.check([1, None], {})                           # 'float | None' is not checked
    with pytest.raises(InvalidArgument, match="'x' must be int"):
        s.check(["1"], {})


def test_example_services_are_checked_despite_future_annotations():
    s = load_spec("gridrpc.examples.services:add")
    s.check([1, 2], {})
    with pytest.raises(InvalidArgument, match="must be int"):
        s.check(["1", 2], {})


def test_without_signature_nothing_is_checked():
    s = Service(name="raw", fn=print)                 # signature=None
    s.check([1, 2, 3], {"whatever": object()})


# -- make_service / describe ---------------------------------------------------
def test_make_service_metadata():
    s = make_service(None, scale)
    assert s.name == "scale" and s.fn is scale
    params = {p["name"]: p for p in s.describe()["params"]}
    assert params["v"] == {"name": "v", "type": "float", "default": None,
                           "kind": "positional_or_keyword"}
    assert params["factor"]["default"] == "1" and params["factor"]["type"] == "complex"
    assert params["label"]["kind"] == "keyword_only"
    assert svc(add).describe() == {"name": "add", "doc": "Return x + y.",
                                   "params": svc(add).params}
    assert make_service("renamed", add, doc="d").describe()["name"] == "renamed"
    assert make_service("renamed", add, doc="d").doc == "d"
    assert {p["name"]: p["type"] for p in svc(untyped).params}["x"] == "any"


def test_make_service_refuses_non_callables():
    with pytest.raises(ConfigError, match="not callable"):
        make_service("x", 42)


# -- load_spec ---------------------------------------------------------------------
def test_load_spec_module_function():
    s = load_spec("tests.test_services_check:add")
    assert s.name == "add" and s.fn is add
    named = load_spec("plus=tests.test_services_check:add")
    assert named.name == "plus" and named.fn is add


def test_load_spec_dotted_attribute_and_estimate():
    s = load_spec("tests.test_services_check:estimate_me")
    assert s.estimate is estimate_me.__gridrpc_estimate__
    s2 = load_spec("gridrpc.examples.services:add")
    assert s2.name == "add" and s2.estimate is None


@pytest.mark.parametrize("spec, message", [
    ("tests.test_services_check", "expected 'package.module:function'"),
    ("name=tests.test_services_check.add", "expected 'package.module:function'"),
    ("", "expected 'package.module:function'"),
    ("no_such_module_xyz:f", "cannot load service 'no_such_module_xyz:f'.*No module named"),
    ("tests.no_such_module_xyz:f", "cannot load service.*No module named"),
    ("tests.test_services_check:nope", "cannot load service.*has no attribute 'nope'"),
    ("tests.test_services_check:add.nope", "cannot load service.*has no attribute 'nope'"),
    ("tests.test_services_check:", "cannot load service"),
    (":add", "cannot load service ':add'"),
    (".relative:add", "cannot load service '.relative:add'"),
    ("tests.test_services_check:not_callable", "not callable"),
])
def test_load_spec_errors_are_config_errors_with_clear_text(spec, message):
    with pytest.raises(ConfigError, match=message):
        load_spec(spec)
