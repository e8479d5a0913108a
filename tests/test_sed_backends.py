"""The SeD's execution back-ends behind one Protocol (gridrpc.sed.backends),
and the SeD runtime around them: it receives through the common Endpoint,
and the batch and cloud SeDs are SeDs with another back-end (no private
method overridden, no header parsed again)."""
from __future__ import annotations

import asyncio
import time

import pytest
import zmq

from gridrpc.core import codec
from gridrpc.core import messages as m
from gridrpc.core.messages import MsgType
from gridrpc.sed.backends import BACKENDS, BaseBackend, ExecutionBackend, Outcome, make_backend
from gridrpc.sed.backends.local import InlineBackend, ProcessBackend
from gridrpc.sed.batch.config import BatchConfig
from gridrpc.sed.batch.jobs import BatchJobs
from gridrpc.sed.batch.sed import BatchSeD
from gridrpc.sed.cloud.config import parse_cloud_config
from gridrpc.sed.cloud.sed import CloudSeD
from gridrpc.sed.cloud.vms import CloudVMs
from gridrpc.sed.server import SeD
from gridrpc.testing import LoopThread, example_sed, wait_for
from gridrpc.transport.endpoint import Endpoint

pytestmark = pytest.mark.timeout(60)


def _cloud_config(**kw):
    return parse_cloud_config({"endpoint": "http://127.0.0.1:9", "region": "us-east-1", "image": "ami-1",
                               "instance_type": "t3.micro", "services": ["gridrpc.examples.services:add"], **kw})


def test_every_back_end_is_an_execution_backend(tmp_path):
    assert {"process", "inline"} <= set(BACKENDS)
    backends = [ProcessBackend(workers=1), InlineBackend(), make_backend("inline"),
                BatchJobs("b", BatchConfig(shared_dir=str(tmp_path)), scheduler=object()),
                CloudVMs("c", _cloud_config(), provider=object())]
    for b in backends:
        assert isinstance(b, ExecutionBackend), type(b)
    assert [b.server_type for b in backends] == ["serial", "serial", "serial", "batch", "cloud"]
    assert [b.remote for b in backends] == [False, False, False, True, True]


def test_batch_and_cloud_seds_are_seds_with_another_back_end(tmp_path):
    batch = BatchSeD("b", config=BatchConfig(shared_dir=str(tmp_path)), backend=object())
    cloud = CloudSeD("c", config=_cloud_config(), provider=object())
    assert isinstance(batch.execution, BatchJobs) and isinstance(cloud.execution, CloudVMs)
    assert batch.server_type == "batch" and cloud.server_type == "cloud"
    assert "add" in cloud.services and cloud.policy is cloud.execution.policy
    assert batch.config.shared_dir == str(tmp_path) and batch.jobs_dir.startswith(str(tmp_path))
    for cls in (BatchSeD, CloudSeD):
        overridden = [name for name in vars(cls) if name.startswith("_") and not name.startswith("__")
                      and callable(getattr(cls, name)) and hasattr(SeD, name)]
        assert overridden == [], f"{cls.__name__} overrides {overridden}"
        assert cls.start is SeD.start and cls.aclose is SeD.aclose and cls.estimate is SeD.estimate
    for sed in (batch, cloud):
        assert isinstance(sed.endpoint, Endpoint)


def test_the_policy_timer_wakes_the_policy_when_it_asks_and_never_after_close():
    """The relay back-ends' one timer (pilots and VMs share it), on the VM
    pool's real policy: an adopted VM that never registers is destroyed once
    its boot timeout passed, at the wake-up the policy asked for; with
    nothing left to wait for the timer stays unset; closed, it never fires."""
    from gridrpc.sed.backends.relay import PolicyTimer
    from gridrpc.sed.cloud.policy import VMPool
    from gridrpc.sed.cloud.pool_model import DestroyVM, PoolConfig

    async def scenario():
        pool = VMPool(PoolConfig(policy="pool", boot_timeout=0.2))
        applied: list = []

        def apply(actions):
            applied.append(actions)
            timer.arm()                     # as the back-ends do after each batch of actions

        timer = PolicyTimer(pool, apply, time.monotonic)
        pool.adopt("vm-1", "i-1", time.monotonic())
        timer.arm()
        timer.arm()                         # armed again: still one timer
        assert timer.handle is not None
        for _ in range(1000):
            if applied:
                break
            await asyncio.sleep(0.01)
        assert len(applied) == 1, applied
        actions = applied[0]
        # the tick came once the boot timeout had passed (the policy destroys the VM only then)
        assert [(a.name, a.vm_id) for a in actions if isinstance(a, DestroyVM)] == [("vm-1", "i-1")]
        assert "did not register within 0.2 s" in actions[0].reason and pool.vms == {}
        assert timer.handle is None                                   # nothing more to wait for
        pool.adopt("vm-2", "i-2", time.monotonic())
        timer.arm()
        timer.close()
        await asyncio.sleep(0.4)
        assert len(applied) == 1 and "vm-2" in pool.vms               # closed: the policy was not woken
        timer.arm()
        assert timer.handle is None

    asyncio.run(scenario())


def test_unknown_isolation_is_a_config_error():
    from gridrpc.errors import ConfigError
    with pytest.raises(ConfigError, match="isolation"):
        SeD("x", isolation="thread")
    with pytest.raises(ConfigError, match="unknown SeD isolation"):
        make_backend("thread")


class Recorder(BaseBackend):
    """A back-end written against the Protocol alone: runs ``add`` itself,
    holds ``sleep`` until cancelled, and tags its answers."""
    name = "recorder"
    server_type = "test"

    def __init__(self):
        self.ran, self.killed, self.prepared = [], [], []

    def prepare(self, service, kwargs, header, buffers):
        opts = kwargs.pop("_color", None)
        self.prepared.append((service.name, opts))
        return kwargs, {"color": opts}

    def ack_fields(self, call):
        return {"patience": 7.0}

    async def run(self, call):
        self.ran.append(call.id)
        if call.service == "sleep":
            await asyncio.sleep(3600)
        return Outcome(ok=True, value=sum(call.args), run_time=0.5, timing={"color": call.options["color"]})

    def kill(self, call):
        self.killed.append(call.id)
        return False

    def estimate(self, replica, service, user, now):
        return {"server_type": self.server_type, "user_seen": user}

    def load(self, replica):
        return {"recorder": True}


def _dealer(address):
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    return s


def _ask(s, header, buffers=(), n=1, timeout=3.0):
    s.send_multipart([m.dumps(header), *buffers])
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        if s.poll(50):
            frames = s.recv_multipart()
            out.append((m.parse_header(frames[0])[1], frames[1:]))
    return out


def test_a_sed_runs_a_new_back_end_through_the_protocol():
    lt = LoopThread()
    rec = Recorder()
    sed = SeD("rsed", execution=rec, max_concurrent=1)
    sed.add_service("add", lambda *xs: None)
    sed.add_service("sleep", lambda s: None)
    lt.run(sed.start())
    s = _dealer(sed.address)
    try:
        (acc, _), (res, _) = _ask(s, m.make(MsgType.CALL, "a1", service="add", args=[1, 2, 3],
                                            kwargs={"_color": "red"}), n=2)
        assert acc["type"] == "accepted" and acc["patience"] == 7.0          # ack_delay 0: at once
        assert res["type"] == "result" and codec.decode(res["value"], []) == 6
        assert res["timing"]["color"] == "red" and res["server"] == "rsed"
        assert rec.prepared == [("add", "red")] and rec.ran == ["a1"]
        # a duplicate is answered from the record, not run again
        [(dup, _)] = _ask(s, m.make(MsgType.CALL, "a1", service="add", args=[9], kwargs={}))
        assert dup["type"] == "result" and rec.ran == ["a1"]
        # cancel: the back-end is asked to stop; the runtime answers
        (acc, _), = _ask(s, m.make(MsgType.CALL, "s1", service="sleep", args=[5], kwargs={}))
        wait_for(lambda: "s1" in rec.ran, 5, "s1 running")       # (it starts once the SeD's read ends)
        out = _ask(s, m.make(MsgType.CANCEL, "s1"), n=2)
        kinds = sorted(h["type"] + ":" + h.get("error", {}).get("kind", "") for h, _ in out)
        assert kinds == ["cancelled:", "error:cancelled"] and rec.killed == ["s1"]
        r = sed.replicas["rsed"]
        vec = lt.call(lambda: sed.estimate(r, sed.services["add"], [], user="ann"))
        assert vec == {"server_type": "test", "user_seen": "ann"}
        assert lt.call(lambda: sed._load(r))["recorder"] is True and r.predictor.predict("add") == 0.5
        assert lt.call(sed.statistics)["results"]["finished"] == 1
    finally:
        s.close()
        lt.run(sed.aclose())
        lt.close()


def test_the_sed_receives_through_the_endpoint_and_answers_bad_fields():
    """Before: a CALL whose ``sed`` field was a list raised in the SeD's own
    receive loop; the sender got no answer."""
    lt = LoopThread()
    sed = lt.run(example_sed("esed", None, isolation="inline").start())
    s = _dealer(sed.address)
    try:
        [(h, _)] = _ask(s, m.make(MsgType.CALL, "x1", service="add", args=[1, 2], kwargs={}, sed=["esed"]))
        assert h["type"] == "error" and h["id"] == "x1" and h["error"]["kind"] == "protocol"
        assert "'sed'" in h["error"]["message"]      # refused at the boundary, naming the field
        [(h, _)] = _ask(s, m.make(MsgType.DISCOVER, "d1", service="add", k=1))
        assert h["error"]["kind"] == "protocol" and "SeD esed does not handle 'discover'" in h["error"]["message"]
        [(h, _)] = _ask(s, m.make(MsgType.CALL, "x2", service="add", args=[1, 2], kwargs={}))
        assert h["type"] == "result"
        s.send_multipart([b"\xff"])
        assert s.poll(3000) and m.parse_header(s.recv_multipart()[0])[1]["error"]["kind"] == "protocol"
        st = lt.call(sed.statistics)
        # two refused at the boundary (the list 'sed', the bytes); one valid call dispatched
        assert st["bad_messages"] == 2 and st["endpoint"]["by_type"]["call"] == 1
    finally:
        s.close()
        lt.run(sed.aclose())
        lt.close()


def test_prestart_workers_forks_them_at_start_and_the_rest_on_demand():
    """``prestart_workers``: that many workers exist before the first call (a burst on many
    replicas then forks nothing on the SeD's loop); the default forks one; calls beyond it fork."""
    from gridrpc.client.aio import AsyncClient
    from gridrpc.errors import ConfigError
    lt = LoopThread()
    seds = [example_sed("pre", None, ["add", "sleep"], replicas=3, prestart_workers=3),
            example_sed("dflt", None, ["add", "sleep"], replicas=3)]
    try:
        for s in seds:
            lt.run(s.start())
        pre, dflt = seds
        assert len(pre.execution.pool.workers) == 3 and pre.execution.pool.spawned == 3
        assert len(dflt.execution.pool.workers) == 1 and dflt.execution.pool.spawned == 1
        pids = {w.proc.pid for w in pre.execution.pool.workers}
        assert all(w.proc.is_alive() for w in pre.execution.pool.workers)

        async def burst(sed):
            from gridrpc.client.futures import ServerInfo
            async with AsyncClient(None) as c:
                calls = [c.submit_nowait("sleep", 0.3, server=ServerInfo(f"{sed.name}-{i}", sed.address))
                         for i in (1, 2, 3)]
                return [await x for x in calls]
        # three calls at once, one per replica: the prestarted SeD uses its three workers, forks none
        lt.run(burst(pre))
        assert pre.execution.pool.spawned == 3 and {w.proc.pid for w in pre.execution.pool.workers} == pids
        lt.run(burst(dflt))
        assert dflt.execution.pool.spawned == 3
    finally:
        for s in seds:
            lt.run(s.aclose())
        lt.close()
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ConfigError, match="prestart_workers"):
            SeD("x", prestart_workers=bad)
    # more than the pool holds: the pool's size bounds it
    s = SeD("y", replicas=2, workers=2, prestart_workers=10)
    assert s.execution.prestart == 2
    assert InlineBackend().name == SeD("z", isolation="inline", prestart_workers=4).isolation


class _LingeringRecorder(Recorder):
    linger_answers = True


@pytest.mark.parametrize("backend, batched", [(Recorder, False), (_LingeringRecorder, True)])
def test_answers_linger_only_where_the_back_end_allows(backend, batched):
    """A client with 100 calls at a SeD gets its answers in batches only from a back-end
    whose ``linger_answers`` says so (the batch back-end keeps an answer that did not reach
    its client: a lingering answer is counted as sent before it leaves)."""
    lt = LoopThread()
    sed = SeD("lsed", execution=backend(), max_concurrent=64)
    sed.add_service("add", lambda *xs: None)
    lt.run(sed.start())
    s = _dealer(sed.address)
    try:
        n = 100
        calls = [[m.dumps(m.make(MsgType.CALL, f"c{i}", service="add", args=[i, 1], kwargs={}))] for i in range(n)]
        s.send_multipart(m.batch(calls))              # a peer that batches, with 100 calls at the SeD
        results, messages = set(), 0
        deadline = time.monotonic() + 10
        while len(results) < n and time.monotonic() < deadline:
            if s.poll(50):
                frames = s.recv_multipart()
                messages += 1
                mt, h = m.parse_header(frames[0])
                parts = m.unbatch(h, frames[1:]) if mt is MsgType.BATCH else [frames]
                for p in parts:
                    ph = m.parse_header(p[0])[1]
                    if ph["type"] == "result":
                        results.add(ph["id"])
        assert len(results) == n
        if batched:
            # the ACCEPTEDs' batch, the results while the client had 32 or more calls here in a few
            # batches, then the last 31 alone (fewer in flight: nothing waits)
            assert messages <= n // 2, messages
        else:
            assert messages > n, messages              # each answer on its own
    finally:
        s.close()
        lt.run(sed.aclose())
        lt.close()
