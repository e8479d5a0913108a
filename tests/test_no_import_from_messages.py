"""No value that came from a message ever reaches an import: every
``importlib.import_module`` of the package takes operator configuration
only (``--plugin``, ``--service``, a batch service's registered function, a
fixed table). Checked end to end on a real in-process tree with an import
hook that records every attempt to import a module named ``evilmod*``:
aggregators, services, registrations and federated discoveries naming such
modules are refused, and nothing is imported."""
from __future__ import annotations

import sys

import pytest
import zmq

from gridrpc.core import messages as m
from gridrpc.testing import LocalTree

pytestmark = pytest.mark.timeout(60)


class _Recorder:
    """A meta-path finder that only records (and never finds) evilmod* imports."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0].startswith("evilmod"):
            self.asked.append(name)
        return None


def _ask(address: str, header: dict) -> dict:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.linger = 0
    try:
        s.connect(address)
        s.send_multipart([m.dumps(header)])
        assert s.poll(5000), f"no answer to {header['type']}"
        return m.parse_header(s.recv_multipart()[0])[1]
    finally:
        s.close()


def test_messages_naming_modules_import_nothing():
    rec = _Recorder()
    sys.meta_path.insert(0, rec)
    try:
        with LocalTree(las=1, seds_per_la=1, http=False) as t:
            ma = t.ma_address
            sed = t.seds[0]
            sed_addr, sed_name = sed.address, next(iter(sed.replicas))
            answers = [
                _ask(ma, m.make(m.MsgType.DISCOVER, "d1", service="add", k=1,
                                aggregator={"name": "evilmod:Agg", "params": {}})),
                _ask(ma, m.make(m.MsgType.DISCOVER, "d2", service="evilmod:run", k=1)),
                _ask(ma, m.make(m.MsgType.DISCOVER, "d3", service="evilmod:run", k=1, via=["X"], hops=2)),
                _ask(sed_addr, m.make(m.MsgType.CALL, "c1", sed=sed_name, service="evilmod:run", args=[],
                                      kwargs={})),
                _ask(ma, m.make(m.MsgType.REGISTER, "r1", name="rogue", kind="sed", address="tcp://127.0.0.1:9",
                                pid=1, services=[{"name": "evilmod:run",
                                                  "aggregator": {"name": "evilmod:Agg"}}])),
                _ask(ma, m.make(m.MsgType.DISCOVER, "d4", service="evilmod:run", k=1)),
            ]
            assert all(a["type"] in ("error", "registered", "servers") for a in answers), answers
            assert answers[0]["type"] == "error" and answers[0]["error"]["kind"] == "invalid_argument"
            assert answers[3]["type"] == "error"                    # the SeD offers no such service
    finally:
        sys.meta_path.remove(rec)
    assert rec.asked == [], f"a message made the process import {rec.asked}"


def test_a_pickle_sent_as_an_argument_is_data_not_code(tmp_path):
    """Arguments cross the SeD -> worker pipe pickled (sed/worker_link.py), but
    the pickle is made by the SeD from what the codec decoded (JSON and raw
    buffers; never a pickle): bytes that are themselves a pickle stay bytes. A
    payload that would create a file if it were ever unpickled comes back as
    sent, and no file appears, in the SeD or its worker process."""
    import gridrpc

    import pickle

    def payload_for(path):
        return f"cbuiltins\nopen\n(S'{path}'\nS'w'\ntR.".encode()      # pickle protocol 0

    live = tmp_path / "live"
    pickle.loads(payload_for(live)).close()         # the payload is live: unpickled, it creates its file
    assert live.exists()
    target = tmp_path / "unpickled"
    payload = payload_for(target)
    with LocalTree(las=0, seds_under_ma=1, http=False) as t:
        assert type(t.seds[0].execution).__name__ == "ProcessBackend"     # through a worker process
        with gridrpc.Client(t.ma_address) as c:
            server = t.sed_names()[0]
            assert c.call("echo", payload, server=server) == payload
            assert c.call("echo", [payload, {"k": payload}], server=server) == [payload, {"k": payload}]
    assert not target.exists()


#: every place of the package that imports by name, runs code from a string or unpickles, and why no
#: value from a message reaches it (a new one fails here until it is reviewed and listed)
DYNAMIC = {
    "gridrpc/__init__.py": "lazy public names: a fixed table (_LAZY)",
    "gridrpc/cli/__init__.py": "a command's module from a fixed table (COMMAND_MODULES); exec of a constant ''",
    "gridrpc/deploy/launchers.py": "lazy launchers: a fixed table (_REMOTE)",
    "gridrpc/plugins.py": "operator's --plugin / deployment-file plugins",
    "gridrpc/sed/services.py": "operator's --service specs",
    "gridrpc/sed/batch/__init__.py": "lazy names: a fixed table (_LAZY)",
    "gridrpc/sed/batch/registry.py": "a built-in scheduler's module from a fixed table (BUILTIN)",
    "gridrpc/sed/backends/registry.py": "a built-in SeD kind's module from a fixed table (BUILTIN)",
    "gridrpc/sed/batch/jobs.py": "a registered service function, found again by its module",
    "gridrpc/sed/batch/run_job.py": "the job's target, written by the SeD from its own service table",
    "gridrpc/sed/worker_link.py": "pickles between a SeD and its own worker process, made by the SeD",
}


def test_every_dynamic_import_site_is_reviewed():
    import re
    from pathlib import Path
    import gridrpc
    root = Path(gridrpc.__file__).parent
    pattern = re.compile(r"\bimport_module\(|__import__\(|(?<![\w.])exec\(|(?<![\w.])eval\(|pickle\.loads\(")
    found = set()
    for p in root.rglob("*.py"):
        code = [line for line in p.read_text().splitlines() if not line.lstrip().startswith("#")]
        if any(pattern.search(line) and "``" not in line for line in code):
            found.add(str(p.relative_to(root.parent)))
    assert found == set(DYNAMIC), (sorted(found - set(DYNAMIC)), sorted(set(DYNAMIC) - found))
