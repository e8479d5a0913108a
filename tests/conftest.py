import pytest

from gridrpc.testing import LocalTree


@pytest.fixture(scope="module")
def tree():
    """An in-process tree: MA -> 2 LAs -> 2 SeDs each, example services, HTTP on."""
    with LocalTree(las=2, seds_per_la=2) as t:
        yield t


@pytest.fixture
def proc_tree(tmp_path):
    from tests.proc_tree import ProcTree
    with ProcTree(tmp_path) as pt:
        yield pt
