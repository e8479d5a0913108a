"""``gridrpc ma|la --no-view`` and ``gridrpc ma --view-max-age``: checked,
carried to the agent's state machine (and from a deployment file), and on
real processes every discovery of a --no-view tree is a fan-out."""
from __future__ import annotations

import asyncio
import random

import pytest

import gridrpc
from gridrpc.cli import main
from gridrpc.core import messages as m
from gridrpc.core.agent.machine import AgentConfig, AgentState, LocalRole, MasterRole, Received, SendParent, Tick
from gridrpc.core.messages import MsgType
from gridrpc.core.view import DEFAULT_MAX_AGE
from gridrpc.testing import wait_for
from benchmarks.view import spy

from tests.test_core_view import answered_from_view, discover, push, register, vec


def _built(monkeypatch, *argv: str):
    """The daemon ``gridrpc ARGV`` would run (nothing is bound or started)."""
    got = []
    monkeypatch.setattr("gridrpc._run.run_daemon", lambda d, ready=None: got.append(d))
    assert main(list(argv)) in (0, None)
    assert len(got) == 1
    return got[0]


def test_view_options_reach_the_agents(monkeypatch):
    ma = _built(monkeypatch, "ma", "--port", "0", "--log-level", "warning")
    assert ma.state.config.view is True and ma.state.config.view_max_age == DEFAULT_MAX_AGE
    ma = _built(monkeypatch, "ma", "--port", "0", "--no-view", "--log-level", "warning")
    assert ma.state.config.view is False
    ma = _built(monkeypatch, "ma", "--port", "0", "--view-max-age", "0.25", "--log-level", "warning")
    assert ma.state.config.view is True and ma.state.config.view_max_age == 0.25
    la = _built(monkeypatch, "la", "--name", "LA1", "--parent", "tcp://127.0.0.1:1", "--log-level", "warning")
    assert la.state.config.view is True
    la = _built(monkeypatch, "la", "--name", "LA1", "--parent", "tcp://127.0.0.1:1", "--no-view",
                "--log-level", "warning")
    assert la.state.config.view is False


@pytest.mark.parametrize("value", ["-1", "nan", "NaN", "inf", "-0.5", "soon"])
def test_bad_view_max_age_is_refused(value, capsys):
    with pytest.raises(SystemExit) as info:
        main(["ma", "--port", "0", "--view-max-age", value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--view-max-age" in err and repr(value) in err


def test_view_max_age_with_no_view_is_refused(capsys):
    assert main(["ma", "--port", "0", "--no-view", "--view-max-age", "1"]) == 2
    assert "--view-max-age with --no-view" in capsys.readouterr().err


def test_runtime_refuses_a_bad_view_max_age():
    from gridrpc.master_agent import MasterAgent
    for bad in (float("nan"), -1.0, float("inf")):
        with pytest.raises(ValueError, match="view_max_age"):
            MasterAgent(address="tcp://127.0.0.1:0", view_max_age=bad)


# -- the state machine ------------------------------------------------------------------
def test_master_agent_without_view_fans_out_and_keeps_nothing():
    on = AgentState(AgentConfig(name="MA"), MasterRole(), random.Random(1))
    off = AgentState(AgentConfig(name="MA", view=False), MasterRole(), random.Random(1))
    for s in (on, off):
        for n in ("sed-1", "sed-2"):
            register(s, n)
            push(s, n, {"add": vec()}, 0.0)
    assert answered_from_view(discover(on, 0.1))
    out = discover(off, 0.1)
    assert not answered_from_view(out)
    assert sorted(n for a in out for n in a.children) == ["sed-1", "sed-2"]      # asked both
    st = off.statistics()
    assert st.view_snapshots == 0 and st.view_updates == 0 and st.views_ignored == 2 and st.view_answers == 0


def test_local_agent_without_view_pushes_nothing_up():
    la = AgentState(AgentConfig(name="LA1", parent="tcp://ma:1", view=False), LocalRole(), random.Random(0))
    for n in ("sed-1", "sed-2"):
        register(la, n)
        push(la, n, {"add": vec()}, 0.0)
    ups = [a for t in (0.003, 0.5, 1.0) for a in la.handle(Tick(), t)
           if isinstance(a, SendParent) and a.header["type"] == "view"]
    assert ups == [] and la.statistics().views_ignored == 2
    hb = m.make(MsgType.HEARTBEAT, "h", name="sed-1", load={})
    la.handle(Received(b"sed-1", MsgType.HEARTBEAT, hb), 1.1)
    assert not [a for a in la.handle(Tick(), 2.0) if isinstance(a, SendParent)]


# -- the deployment file -----------------------------------------------------------------
YAML = """\
master_agent: {name: MA, host: localhost, port: 5555%s}
local_agents:
  - {name: LA1, parent: MA, host: localhost%s}
seds:
  - {name: sed-1, parent: LA1, host: localhost, examples: true}
"""


def test_deployment_file_sets_the_view_options(tmp_path):
    from gridrpc.deploy.runner import Deployment
    from gridrpc.deploy.spec import load
    f = tmp_path / "d.yaml"
    f.write_text(YAML % (", view: false", ", view: false"))
    spec = load(f)
    d = Deployment(spec, state_dir=str(tmp_path / "state"))
    d.addresses.update(MA="tcp://a:1", LA1="tcp://b:2")
    assert "--no-view" in d.command(spec.element("MA")) and "--no-view" in d.command(spec.element("LA1"))
    f.write_text(YAML % (", view_max_age: 0.5", ""))
    spec = load(f)
    d = Deployment(spec, state_dir=str(tmp_path / "state"))
    d.addresses.update(MA="tcp://a:1", LA1="tcp://b:2")
    cmd = d.command(spec.element("MA"))
    assert cmd[cmd.index("--view-max-age") + 1] == "0.5" and "--no-view" not in cmd
    assert "--no-view" not in d.command(spec.element("LA1"))
    for bad, words in ((", view_max_age: -1", "master_agent.view_max_age"),
                       (", view_max_age: .nan", "master_agent.view_max_age"),
                       (", view: maybe", "master_agent.view")):
        f.write_text(YAML % (bad, ""))
        from gridrpc.errors import ConfigError
        with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
            load(f)
    f.write_text(YAML % ("", ", view_max_age: 1"))          # an LA answers no discovery from a view
    with pytest.raises(ConfigError, match="unknown key"):
        load(f)


# -- real processes ------------------------------------------------------------------------
async def _answers(ma_address: str, n: int) -> tuple[dict, dict]:
    """``n`` discoveries of ``add``: the MA's SERVERS answers counted by
    their ``view`` flag, and the MA's statistics after them."""
    async with gridrpc.AsyncClient(ma_address, retry_timeout=10) as c:
        counts = spy(c)                 # the benchmark's counter of answers by source
        for _ in range(n):
            assert await c.discover("add", 3)
        load = next(e for e in await c.tree() if e["name"] == "MA")["load"]
    return counts, load


def _tree(proc_tree, *flags: str):
    ma = proc_tree.start("ma", "MA", *flags)
    la = proc_tree.start("la", "LA1", *flags, parent=ma.address)
    proc_tree.sed("s-la", la.address)
    proc_tree.sed("s-ma", ma.address)                   # one SeD right under the MA: it pushes to the MA
    with gridrpc.Client(ma.address) as c:
        wait_for(lambda: sum(e.get("kind") == "sed" for e in c.tree()) == 2, 20, "both SeDs registered")
    return ma


def test_no_view_tree_answers_every_discovery_by_fan_out(proc_tree):
    ma = _tree(proc_tree, "--no-view")
    import time
    time.sleep(0.5)                                     # the SeDs' first pushes are in
    counts, load = asyncio.run(_answers(ma.address, 30))
    assert counts == {"view": 0, "fanout": 30}
    assert load["view_answers"] == 0 and load["view_snapshots"] == 0 and load["view_updates"] == 0
    assert load["views_ignored"] >= 1                   # s-ma still pushes; the MA drops it unread
    proc_tree.stop()


def test_same_tree_with_views_answers_from_the_view(proc_tree):
    """The control: without --no-view the same discoveries come from the view
    (so the test above can tell the two apart)."""
    ma = _tree(proc_tree)
    wait_for(lambda: asyncio.run(_answers(ma.address, 1))[0]["view"] == 1, 10, "a view answer")
    counts, load = asyncio.run(_answers(ma.address, 30))
    assert counts["view"] >= 25 and load["view_answers"] >= 25 and load["views_ignored"] == 0
