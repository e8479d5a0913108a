"""Federation of two trees (DIET's Multi-MA) with real processes: a call
for a service only the other site offers succeeds (the client calls the
remote SeD directly); a ring of peers does not loop; a peer site that
cannot be reached fails fast with a clear error. First on loopback, then
with the two sites on two namespace hosts and a real partition between them
(``tests/netns.py``), and with CURVE between the peers."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

import gridrpc
from tests.conftest_netns import netns_cluster  # noqa: F401
from tests.proc_tree import ProcTree, free_port

pytestmark = [pytest.mark.timeout(180), pytest.mark.real]


def _two_sites(pt: ProcTree, *, extra_a=(), extra_b=(), ring=True):
    pa, pb = free_port(), free_port()
    a_addr, b_addr = f"tcp://127.0.0.1:{pa}", f"tcp://127.0.0.1:{pb}"
    ma_a = pt.start("ma", "MA-A", "--peer", b_addr, *extra_a, port=pa)
    ma_b = pt.start("ma", "MA-B", *(("--peer", a_addr) if ring else ()), *extra_b, port=pb)
    pt.start("sed", "sed-a", "--service", "gridrpc.examples.services:add", *extra_a, parent=ma_a.address)
    pt.start("sed", "sed-b", "--service", "gridrpc.examples.services:echo", *extra_b, parent=ma_b.address)
    return ma_a, ma_b


def _wait_offers(ma: str, service: str, **kw) -> None:
    deadline = time.monotonic() + 20
    with gridrpc.Client(ma, **kw) as c:
        while service not in c.services():
            assert time.monotonic() < deadline, f"{service} never registered at {ma}"
            time.sleep(0.1)


def test_a_service_only_the_other_site_has(tmp_path):
    with ProcTree(tmp_path) as pt:
        ma_a, ma_b = _two_sites(pt)
        _wait_offers(ma_a.address, "add")
        _wait_offers(ma_b.address, "echo")
        with gridrpc.Client(ma_a.address, user="alice", timeout=20) as c:
            assert c.call("add", 2, 3) == 5                        # local
            call = c.submit("echo", "from A")                      # only site B has it
            assert call.result(timeout=20) == "from A"
            assert call.server == "sed-b"
            servers = c.discover("echo")
            assert [s.name for s in servers] == ["sed-b"] and servers[0].address.startswith("tcp://127.0.0.1:")
            with pytest.raises(gridrpc.ServiceNotFound) as info:     # nobody has it: both sites named
                c.call("no-such-service", 1)
            assert "MA-A" in str(info.value) and "no-such-service" in str(info.value)
        with gridrpc.Client(ma_b.address, user="bob", timeout=20) as c:   # and the other way round
            assert c.call("add", 1, 1) == 2


def test_a_dead_peer_fails_fast_with_a_clear_error(tmp_path):
    with ProcTree(tmp_path) as pt:
        ma_a, ma_b = _two_sites(pt, ring=False)
        _wait_offers(ma_a.address, "add")
        _wait_offers(ma_b.address, "echo")
        ma_b.stop()                                                 # site B gone (its link drops at once)
        time.sleep(0.5)
        with gridrpc.Client(ma_a.address, user="alice", timeout=20) as c:
            t0 = time.monotonic()
            with pytest.raises(gridrpc.CommunicationError) as info:
                c.call("echo", "a b")
            took = time.monotonic() - t0
            assert "MA-A" in str(info.value) and "could not be asked" in str(info.value)
            assert took < 5, f"took {took:.1f}s"                    # not the call's 20 s timeout
            assert c.call("add", 1, 2) == 3                         # the local tree is unaffected


def _keys(dir_, *elements, users=()):
    for name in elements:
        subprocess.run([sys.executable, "-m", "gridrpc", "keys", "create", name, "--element", "--dir", str(dir_)],
                       check=True, capture_output=True)
    for name in users:
        subprocess.run([sys.executable, "-m", "gridrpc", "keys", "create", name, "--dir", str(dir_)],
                       check=True, capture_output=True)
    return str(dir_)


def test_peers_over_curve_and_a_stranger_peer_is_refused(tmp_path):
    """Both sites under CURVE with one key directory (the peers' keys known
    to each other): the federated call works. A third MA whose key site A
    does not know cannot get A to answer: its forward is refused by A's
    ZAP handler and its client gets ``peer_unreachable``, fast."""
    keys = _keys(tmp_path / "keys", "MA-A", "MA-B", "sed-a", "sed-b", users=["alice"])
    other = _keys(tmp_path / "other", "MA-C", users=["carol"])
    sec = ("--secure", "--keys", keys)
    with ProcTree(tmp_path) as pt:
        pa, pb, pc = free_port(), free_port(), free_port()
        a_addr = f"tcp://127.0.0.1:{pa}"
        ma_a = pt.start("ma", "MA-A", *sec, "--peer", f"tcp://127.0.0.1:{pb}", "--peer-key", "MA-B", port=pa)
        ma_b = pt.start("ma", "MA-B", *sec, port=pb)
        pt.start("sed", "sed-a", "--service", "gridrpc.examples.services:add", *sec, "--parent-key", "MA-A",
                 parent=ma_a.address)
        pt.start("sed", "sed-b", "--service", "gridrpc.examples.services:echo", *sec, "--parent-key", "MA-B",
                 parent=ma_b.address)
        # the stranger knows A's public key, but A does not know its key
        a_pub = (tmp_path / "keys" / "elements" / "MA-A.key")
        ma_c = pt.start("ma", "MA-C", "--secure", "--keys", other, "--peer", a_addr, "--peer-key", str(a_pub),
                        port=pc)
        _wait_offers(ma_a.address, "add", keys=keys, user="alice", ma_key="MA-A")
        _wait_offers(ma_b.address, "echo", keys=keys, user="alice", ma_key="MA-B")
        with gridrpc.Client(ma_a.address, keys=keys, user="alice", ma_key="MA-A", timeout=20) as c:
            assert c.call("echo", "over curve") == "over curve"       # A -> B over CURVE, then sed-b directly
        with gridrpc.Client(ma_c.address, keys=other, user="carol", ma_key="MA-C", timeout=20) as c:
            t0 = time.monotonic()
            with pytest.raises(gridrpc.CommunicationError) as info:
                c.call("add", 1, 2)
            assert "could not be asked" in str(info.value) and time.monotonic() - t0 < 5


def test_two_sites_on_two_hosts_and_a_partition(netns_cluster):  # noqa: F811
    """Site A on host h1, site B on host h2, real network between them: a call
    from h1 for the service only B has succeeds; after a partition of h2 the
    same call fails within the discovery budget with a clear error (and the
    local service still works); after healing it works again."""
    cl = netns_cluster
    a_ip, b_ip = cl.address("h1"), cl.address("h2")
    py = [sys.executable, "-m", "gridrpc"]
    common = ["--hb-interval", "0.3", "--hb-timeout", "1", "--insecure"]
    cl.popen("h1", py + ["ma", "--name", "MA-A", "--host", a_ip, "--port", "5555", "--peer", f"tcp://{b_ip}:5555",
                         *common], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cl.popen("h2", py + ["ma", "--name", "MA-B", "--host", b_ip, "--port", "5555", "--peer", f"tcp://{a_ip}:5555",
                         *common], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cl.popen("h1", py + ["sed", "--name", "sed-a", "--host", a_ip, "--parent", f"tcp://{a_ip}:5555",
                         "--service", "gridrpc.examples.services:add", *common],
             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cl.popen("h2", py + ["sed", "--name", "sed-b", "--host", b_ip, "--parent", f"tcp://{b_ip}:5555",
                         "--service", "gridrpc.examples.services:echo", *common],
             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = (
        "import sys, time, gridrpc\n"
        "ma = sys.argv[1]\n"
        "end = time.monotonic() + 30\n"
        "with gridrpc.Client(ma, user='alice', timeout=10) as c:\n"
        "    while time.monotonic() < end:\n"
        "        try:\n"
        "            if c.call('add', 1, 2) == 3 and c.call('echo', 'x') == 'x':\n"
        "                break\n"
        "        except gridrpc.GridRPCError:\n"
        "            time.sleep(0.3)\n"
        "    else:\n"
        "        sys.exit('the two sites never came up')\n"
        "    t0 = time.monotonic()\n"
        "    try:\n"
        "        print('ECHO', c.call(sys.argv[2], 'across'), flush=True)\n"
        "    except gridrpc.GridRPCError as e:\n"
        "        print('ERROR', type(e).__name__, round(time.monotonic() - t0, 2), e, flush=True)\n"
        "    print('ADD', c.call('add', 2, 2), flush=True)\n"
    )
    ma = f"tcp://{a_ip}:5555"
    r = cl.exec("h1", [sys.executable, "-c", client, ma, "echo"], timeout=60)
    assert "ECHO across" in r.stdout and "ADD 4" in r.stdout, r.stdout + r.stderr
    cl.partition("h2")
    try:
        r = cl.exec("h1", [sys.executable, "-c", client.replace("and c.call('echo', 'x') == 'x'", ""), ma, "echo"],
                    timeout=60)
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("ERROR")), None)
        assert line is not None, r.stdout + r.stderr
        _, kind, took, *msg = line.split(" ", 3)
        assert kind == "CommunicationError" and "could not be asked" in line and float(took) < 5, line
        assert "ADD 4" in r.stdout
    finally:
        cl.heal("h2")
    deadline = time.monotonic() + 30
    while True:
        r = cl.exec("h1", [sys.executable, "-c", client, ma, "echo"], timeout=60)
        if "ECHO across" in r.stdout:
            break
        assert time.monotonic() < deadline, r.stdout + r.stderr
        time.sleep(1)
