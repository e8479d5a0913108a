"""Workflows: HEFT placement (pure), a 20-node DAG with a failing node, YAML files."""
import numpy as np
import pytest

import gridrpc
from gridrpc.examples import services as S
from gridrpc.sed.data.store import DataConfig
from gridrpc.testing import LocalTree
from gridrpc.workflow import Workflow, load
from gridrpc.workflow.heft import ServerEstimate, Task, heft, topological


def test_heft_keeps_chains_together_and_spreads_independent_work():
    tasks = {"a": Task(name="a", service="s", out_bytes=1e9), "b": Task(name="b", service="s", deps=["a"]),
             "x": Task(name="x", service="s"), "y": Task(name="y", service="s")}
    servers = {"s": [ServerEstimate(name="s1", tcomp=1.0), ServerEstimate(name="s2", tcomp=1.0)]}
    order, where = heft(tasks, servers, bandwidth=1e8)        # moving a's result costs 10 s
    assert order.index("a") < order.index("b") and where["a"] == where["b"]
    assert len(set(where.values())) == 2
    with pytest.raises(ValueError, match="cycle"):
        topological({"a": Task(name="a", service="s", deps=["b"]), "b": Task(name="b", service="s", deps=["a"])})


@pytest.fixture(scope="module")
def wtree():
    with LocalTree(las=1, seds_per_la=3, services=S.ALL + S.DATA, http=False,
                   sed_options={"data": DataConfig(fetch_timeout=3.0), "max_concurrent": 2}) as t:
        yield t


def test_twenty_nodes_with_a_failing_node(wtree):
    lines = []
    with gridrpc.Client(wtree.ma_address, user="alice", timeout=60) as c:
        wf = Workflow(c, progress=lines.append)
        sources = [wf.add("produce", 1000, float(i), name=f"p{i}") for i in range(4)]
        bad = wf.add("fail", "node f broke", name="f")
        mids = [wf.add("transform", s, name=f"t{i}") for i, s in enumerate(sources)]
        doomed = wf.add("transform", bad, name="g")             # descendant of the failure
        doomed2 = wf.add("combine", doomed, mids[0], name="h")  # and its descendant
        sums = [wf.add("reduce_sum", m, name=f"r{i}") for i, m in enumerate(mids)]
        wf.add("combine", *sums, name="total")
        wf.add("combine", mids[1], mids[2], name="pair")
        wf.add("combine", sums[3], name="z")
        wf.add("combine", sums[1], name="y")
        wf.add("produce", 3, name="solo")
        assert len(wf.nodes) == 20
        res = wf.run(timeout=120)
    assert set(res.errors) == {"f", "g", "h"}
    assert res.errors["f"].cause == "f" and "node f broke" in str(res.errors["f"])
    for n in ("g", "h"):
        assert res.errors[n].cause == "f" and "ancestor 'f' failed" in str(res.errors[n])
    expect = sum(1000 * (2.0 * i + 1.0) for i in range(4))
    assert res["total"] == expect
    assert res["pair"] == 1000 * 3.0 + 1000 * 5.0
    assert len(set(res.placement.values())) >= 2                # spread over the servers
    assert sum(line.startswith("[") for line in lines) == 20
    assert "17/20 nodes done, 3 failed" in lines[-1]


def test_yaml_workflow_and_cli(wtree, tmp_path, capsys):
    text = """
nodes:
  a: {service: produce, args: [100, 2.0]}
  b: {service: transform, args: [$a], kwargs: {factor: 3.0}}
  c: {service: reduce_sum, args: [$b]}
"""
    with gridrpc.Client(wtree.ma_address, user="alice", timeout=30) as c:
        assert load(text, c, progress=None).run(60)["c"] == 100 * 7.0
    import argparse
    from gridrpc.workflow.cli import add_parser
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    f = tmp_path / "wf.yaml"
    f.write_text(text)
    a = p.parse_args(["workflow", "run", str(f), "--ma", wtree.ma_address, "--user", "alice"])
    assert a.func(a) == 0
    out = capsys.readouterr().out
    assert "c = 700.0" in out and "[3/3]" in out
