"""The child side of the tree (gridrpc.transport.parent_link): a child that
gets no answer from its parent says so at WARNING, once after a few seconds
and then periodically, never silently forever."""
import asyncio
import logging

import zmq
import zmq.asyncio

from gridrpc.core import messages as m
from gridrpc.core.messages import MsgType
from gridrpc.transport.parent_link import ParentLink
from tests.proc_tree import free_port

LOGGER = "gridrpc.transport.parent_link"


def _link(parent, **kw):
    return ParentLink(name="child-1", parent=parent, register_info=lambda: {"kind": "sed", "services": []},
                      heartbeat_info=lambda: {}, on_message=lambda *a: None, hb_interval=0.05, hb_timeout=0.3,
                      **kw)


def _waiting_lines(caplog):
    return [r for r in caplog.records if r.name == LOGGER and "waiting for parent at" in r.getMessage()]


def test_wrong_parent_warns_after_a_while_then_periodically(caplog):
    parent = f"tcp://127.0.0.1:{free_port()}"            # nobody there

    async def run():
        link = _link(parent, warn_after=0.4, warn_every=0.5)
        link.start()
        try:
            await asyncio.sleep(0.3)
            early = len(_waiting_lines(caplog))
            await asyncio.sleep(1.0)                       # t = 1.3 s: warned at ~0.4 and ~0.9
            return early, len(_waiting_lines(caplog))
        finally:
            await link.aclose()

    with caplog.at_level(logging.INFO, logger=LOGGER):
        early, later = asyncio.run(run())
    assert early == 0                                      # not at once: a parent may start late
    assert 2 <= later <= 3                                 # then again every warn_every, not every heartbeat
    rec = _waiting_lines(caplog)[0]
    assert rec.levelno == logging.WARNING and parent in rec.getMessage()


def test_defaults_warn_after_seconds_and_every_30s():
    async def make():
        link = _link("tcp://127.0.0.1:1")
        return link.warn_after, link.warn_every
    after, every = asyncio.run(make())
    assert 2 <= after <= 10 and every == 30.0


def test_no_warning_once_attached_and_refusal_logged(caplog):
    """A parent that answers: no waiting warning; a parent that refuses the
    registration (an ERROR) is reported with its reason."""

    async def run():
        ctx = zmq.asyncio.Context.instance()
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        link = _link(f"tcp://127.0.0.1:{port}", warn_after=0.2, warn_every=0.2)
        link.start()
        try:
            route, raw = await asyncio.wait_for(router.recv_multipart(), 3)
            h = m.parse_header(raw)[1]
            await router.send_multipart([route, m.dumps(m.error_header(h["id"], "protocol", "bad name, go away"))])
            await asyncio.sleep(0.1)
            refused = [r for r in caplog.records if "refused" in r.getMessage()]
            while True:                                    # now accept the next registration
                route, raw = await asyncio.wait_for(router.recv_multipart(), 3)
                mt, h = m.parse_header(raw)
                if mt is MsgType.REGISTER:
                    await router.send_multipart([route, m.dumps(m.make(MsgType.REGISTERED, h["id"]))])
                    break
            await asyncio.wait_for(link.attach_event.wait(), 3)
            n = len(_waiting_lines(caplog))
            for _ in range(10):                            # attached: heartbeats acknowledged
                try:
                    route, raw = await asyncio.wait_for(router.recv_multipart(), 0.1)
                except asyncio.TimeoutError:
                    continue
                mt, h = m.parse_header(raw)
                if mt is MsgType.HEARTBEAT:
                    await router.send_multipart([route, m.dumps(m.make(MsgType.HEARTBEAT_ACK, h["id"], known=True))])
            return refused, n, len(_waiting_lines(caplog))
        finally:
            await link.aclose(unregister=False)
            router.close()

    with caplog.at_level(logging.INFO, logger=LOGGER):
        refused, before, after = asyncio.run(run())
    assert len(refused) == 1 and refused[0].levelno == logging.WARNING
    assert "bad name, go away" in refused[0].getMessage()
    assert after == before                                 # attached: no more waiting warnings
