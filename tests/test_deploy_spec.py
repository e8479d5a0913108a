"""Deployment files are validated whole, before anything starts: every
problem at once, each naming the file, the line and the field."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gridrpc.deploy.spec import load, parse
from gridrpc.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]

GOOD = """\
name: t
heartbeat: {interval: 0.5, timeout: 2}
master_agent: {name: MA, host: localhost, port: 5555, http_port: 8080}
local_agents:
  - {name: LA1, parent: MA, host: localhost}
seds:
  - {name: sed-1, parent: LA1, host: localhost, examples: true, max_concurrent: 1, queue: fcfs}
  - name: sed-2
    parent: LA1
    services: [gridrpc.examples.services:add]
    queue: ethic
    kill_grace: 1.5
"""


def write(tmp_path, text: str, name: str = "d.yaml") -> Path:
    f = tmp_path / name
    f.write_text(text)
    return f


def problems(f: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load(f)
    return str(info.value)


def test_good_file_loads(tmp_path):
    spec = load(write(tmp_path, GOOD))
    assert [e.name for e in spec.elements] == ["MA", "LA1", "sed-1", "sed-2"]
    assert spec.ma.port == 5555 and spec.ma.http_port == 8080
    assert spec.element("sed-2").options["queue"] == "ethic"
    assert spec.element("sed-2").options["kill_grace"] == 1.5
    assert spec.hb_interval == 0.5 and spec.hb_timeout == 2.0


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "deployments").glob("*.yaml")))
def test_every_shipped_file_still_loads(name):
    spec = load(REPO / "deployments" / f"{name}.yaml")
    assert [m.name for m in spec.mas] == (["MA1", "MA2"] if name == "two-mas" else ["MA"])


def test_bad_port_names_file_line_and_field(tmp_path):
    f = write(tmp_path, GOOD.replace("port: 5555", "port: 55x55"))
    msg = problems(f)
    assert f"{f}:3:" in msg                          # file:line, clickable in editors and terminals
    assert "master_agent.port" in msg and "55x55" in msg
    assert "Traceback" not in msg


def test_bad_queue_is_refused_before_anything_starts(tmp_path):
    f = write(tmp_path, GOOD.replace("queue: fcfs", "queue: fcsf"))
    msg = problems(f)
    assert f"{f}:7:" in msg and "seds[0].queue" in msg and "sed-1" in msg
    assert "fcsf" in msg and "fcfs" in msg and "ethic" in msg        # what is known


def test_every_problem_at_once(tmp_path):
    text = GOOD.replace("port: 5555", "port: 55x55").replace("queue: fcfs", "queue: fcsf") \
        .replace("kill_grace: 1.5", "kill_grace: soon").replace("interval: 0.5", "interval: -1")
    msg = problems(write(tmp_path, text))
    for field, line in (("master_agent.port", 3), ("seds[0].queue", 7), ("seds[1].kill_grace", 12),
                        ("heartbeat.interval", 2)):
        assert re.search(rf":{line}: .*{re.escape(field)}", msg), (field, msg)
    assert "4 problems" in msg


def test_yaml_syntax_error_names_the_file_and_line(tmp_path):
    f = write(tmp_path, "master_agent: {name: MA\nseds: [\n")
    msg = problems(f)
    assert str(f) in msg and "<unicode string>" not in msg
    assert "not valid YAML" in msg and re.search(rf"{re.escape(str(f))}:\d+:", msg)


def test_unknown_key_with_a_suggestion(tmp_path):
    f = write(tmp_path, GOOD.replace("max_concurrent: 1", "max_concurent: 1"))
    msg = problems(f)
    assert f"{f}:7:" in msg and "unknown keys max_concurent (did you mean max_concurrent?)" in msg


@pytest.mark.parametrize("edit, field, words", [
    (("examples: true, max", "examples: yes please, max"), "seds[0].examples", "boolean"),
    (("max_concurrent: 1", "max_concurrent: 0"), "seds[0].max_concurrent", ">= 1"),
    (("host: localhost, examples", "host: localhost, isolation: thread, examples"), "seds[0].isolation",
     "'process' or 'inline'"),
    (("http_port: 8080", "http_port: 70000"), "master_agent.http_port", "65535"),
    (("{name: LA1, parent: MA", "{name: LA 1, parent: MA"), "local_agents[0].name", "letters"),
    (("services: [gridrpc.examples.services:add]", "services: gridrpc.examples.services:add"),
     "seds[1].services", "list"),
    (("services: [gridrpc.examples.services:add]", "services: [gridrpc.examples.services.add]"),
     "seds[1].services[0]", "module:function"),
    (("name: t\n", "name: t\nplugins: {aggregators: [nocolon]}\n"), "plugins.aggregators[0]", "module:Class"),
    (("name: t\n", "name: t\norphan_timeout: soon\n"), "orphan_timeout", "number of seconds"),
])
def test_values_are_checked(tmp_path, edit, field, words):
    f = write(tmp_path, GOOD.replace(*edit, 1))
    msg = problems(f)
    assert field in msg and words in msg, msg


def test_semantic_problems_have_lines_too(tmp_path):
    text = GOOD.replace("{name: LA1, parent: MA, host: localhost}", "{name: LA1, parent: MA, host: nowhere}") \
        .replace("- name: sed-2\n    parent: LA1", "- name: sed-2\n    parent: LA9")
    msg = problems(write(tmp_path, text))
    assert re.search(r":5: .*local_agents\[0\]\.host.*'nowhere'", msg), msg
    assert re.search(r":9: .*seds\[1\]\.parent.*'LA9' is not an agent", msg), msg


def test_batch_and_cloud_values_are_checked_with_lines(tmp_path):
    text = GOOD + """\
  - name: hpc
    parent: LA1
    kind: batch
    scheduler: slurm
    poll_interval: -2
    services: [gridrpc.examples.services:add]
  - name: ec2
    parent: MA
    kind: cloud
    image: ami-1
    instance_type: t3.micro
    policy: sometimes
    services: [gridrpc.examples.services:add]
"""
    msg = problems(write(tmp_path, text))
    assert re.search(r":17: .*seds\[2\]\.poll_interval", msg), msg
    assert re.search(r":24: .*seds\[3\]\.policy.*sometimes", msg), msg


def test_duplicate_keys_are_refused(tmp_path):
    msg = problems(write(tmp_path, GOOD.replace("    queue: ethic\n", "    queue: ethic\n    queue: fcfs\n")))
    assert re.search(r":12: seds\[1\]\.queue.*duplicate key \(also on line 11", msg), msg


def test_plugins_section_accepted(tmp_path):
    spec = load(write(tmp_path, GOOD + "plugins: {aggregators: ['pkg.mod:Agg', 'other:B']}\n"))
    assert spec.aggregator_plugins == ("pkg.mod:Agg", "other:B")


def test_dicts_without_a_file_still_parse_and_errors_name_fields():
    spec = parse({"master_agent": {"name": "MA", "port": 0}, "seds": [{"name": "s", "parent": "MA",
                                                                      "examples": True}]})
    assert spec.element("s").parent == "MA"
    with pytest.raises(ConfigError, match=r"seds\[0\]\.port"):
        parse({"master_agent": {"name": "MA"}, "seds": [{"name": "s", "parent": "MA", "examples": True,
                                                         "port": "x"}]})


def test_deploy_up_of_a_bad_file_starts_nothing(tmp_path):
    f = write(tmp_path, GOOD.replace("queue: fcfs", "queue: fcsf").replace("5555", "0").replace("8080", "0"))
    r = subprocess.run([sys.executable, "-m", "gridrpc", "deploy", "up", str(f), "--state-dir",
                        str(tmp_path / "st")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"{f}:7:" in r.stderr and "starting" not in r.stderr
    assert not (tmp_path / "st" / "state.json").exists()


def test_state_round_trip_keeps_the_raw_spec(tmp_path):
    spec = load(write(tmp_path, GOOD))
    again = parse(json.loads(json.dumps(spec.raw)), name=spec.name)
    assert again.elements == spec.elements


# -- several master agents, federation peers ---------------------------------------

TWO_MAS = """\
name: t2
master_agent:
  - {name: MA1, host: localhost, port: 5555, http_port: 8080}
  - {name: MA2, host: localhost, port: 5556, peers: [site-b:5555, "tcp://10.0.0.9:6000"], peer_hops: 1}
local_agents:
  - {name: LA1, parent: MA2}
seds:
  - {name: sed-1, parent: LA1, examples: true}
  - {name: sed-2, parent: MA1, examples: true}
"""


def _deployment(spec, **addresses):
    from gridrpc.deploy.runner import Deployment
    d = Deployment(spec, state_dir="/tmp/unused")
    d.addresses.update(addresses)
    return d


def test_several_mas_are_one_root_and_children_attach_to_all(tmp_path):
    spec = load(write(tmp_path, TWO_MAS))
    assert [m.name for m in spec.mas] == ["MA1", "MA2"] and spec.ma.name == "MA1"
    assert spec.ordered()[0] == spec.mas                              # both MAs start first
    assert spec.parents_of(spec.element("LA1")) == ["MA1", "MA2"]     # parent MA2: attached to both
    assert spec.parents_of(spec.element("sed-2")) == ["MA1", "MA2"]
    assert spec.parents_of(spec.element("sed-1")) == ["LA1"]
    assert spec.element("MA2").options == {"peers": ["tcp://site-b:5555", "tcp://10.0.0.9:6000"], "peer_hops": 1}
    d = _deployment(spec, MA1="tcp://127.0.0.1:5555", MA2="tcp://127.0.0.1:5556", LA1="tcp://127.0.0.1:7000")

    def arg(cmd, flag):
        return [cmd[i + 1] for i, x in enumerate(cmd) if x == flag]
    la, sed1, sed2 = (d.command(spec.element(n)) for n in ("LA1", "sed-1", "sed-2"))
    assert arg(la, "--parent") == arg(sed2, "--parent") == ["tcp://127.0.0.1:5555,tcp://127.0.0.1:5556"]
    assert arg(sed1, "--parent") == ["tcp://127.0.0.1:7000"]
    ma1, ma2 = d.command(spec.element("MA1")), d.command(spec.element("MA2"))
    assert "--parent" not in ma1 and "--peer" not in ma1 and arg(ma1, "--http-port") == ["8080"]
    assert arg(ma2, "--peer") == ["tcp://site-b:5555", "tcp://10.0.0.9:6000"] and arg(ma2, "--peer-hops") == ["1"]
    assert "--peer-key" not in ma2 and "--secure" not in ma2          # security off: no keys
    assert d.ma_addresses() == ["tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556"]
    assert d.ma_address == "tcp://127.0.0.1:5555,tcp://127.0.0.1:5556"   # what clients are given
    assert d.summary()["ma"] == d.ma_address
    assert d.expected_names("MA2") == {"MA2", "LA1", "sed-1", "sed-2"}  # each MA's tree: itself + everyone


def test_several_mas_under_security(tmp_path):
    text = TWO_MAS.replace('peer_hops: 1}', 'peer_hops: 1, peer_keys: [site-b-MA, /keys/c.key]}') \
        + "security: {enabled: true}\n"
    spec = load(write(tmp_path, text))
    d = _deployment(spec, MA1="tcp://127.0.0.1:5555", MA2="tcp://127.0.0.1:5556", LA1="tcp://127.0.0.1:7000")
    la, sed1, ma2 = (d.command(spec.element(n)) for n in ("LA1", "sed-1", "MA2"))
    assert la[la.index("--parent-key") + 1] == "MA1,MA2"             # same order as --parent
    assert sed1[sed1.index("--parent-key") + 1] == "LA1"
    assert [ma2[i:i + 4] for i, x in enumerate(ma2) if x == "--peer"] == [
        ["--peer", "tcp://site-b:5555", "--peer-key", "site-b-MA"],
        ["--peer", "tcp://10.0.0.9:6000", "--peer-key", "/keys/c.key"]]
    assert d.client_options()["ma_key"] == "MA1,MA2"                 # one key per MA, in address order
    assert d.client_options(["MA2"])["ma_key"] == "MA2"
    # peers under security need their keys
    msg = problems(write(tmp_path, TWO_MAS + "security: {enabled: true}\n", "nokeys.yaml"))
    assert re.search(r"nokeys\.yaml:4: master_agent\[1\]\.peers \(MA MA2\): with security on, each peer "
                     r"needs its public key: peer_keys", msg), msg


def test_peer_keys_missing_locally_stop_up_before_anything_starts(tmp_path):
    from gridrpc.deploy.runner import DeployError
    text = TWO_MAS.replace('peer_hops: 1}', 'peer_keys: [nobody-MA, "%s"]}' % ("x" * 40)) \
        .replace("port: 5555, http_port: 8080", "port: 0").replace("port: 5556,", "port: 0,") \
        + "security: {enabled: true}\n"
    spec = load(write(tmp_path, text))
    d = _deployment(spec)
    d.state_dir = tmp_path / "st"
    with pytest.raises(DeployError) as info:
        d.up()
    assert "MA2: peer tcp://site-b:5555: 'nobody-MA' is not an element key" in str(info.value)
    assert "10.0.0.9" not in str(info.value)                          # the literal key is fine
    assert "nothing was started" in str(info.value)
    assert not d.started and not (tmp_path / "st" / "state.json").exists()


@pytest.mark.parametrize("edit, where, words", [
    (("master_agent:\n  - {name: MA1, host: localhost, port: 5555, http_port: 8080}\n"
      "  - {name: MA2, host: localhost, port: 5556, peers: [site-b:5555, \"tcp://10.0.0.9:6000\"], peer_hops: 1}\n",
      "master_agent: []\n"), r":2: master_agent:", "an empty list: give at least one master agent"),
    (("name: MA2", "name: MA1"), r":4: master_agent\[1\]\.name \(MA MA1\):",
     "element names must be unique: MA1 is also master_agent[0] (each master agent needs its own name)"),
    (("port: 5556, ", ""), r":4: master_agent\[1\]\.name \(MA MA2\):",
     "port 5555 (the default port) on host localhost is taken by master_agent[0] (port)"),
    (("port: 5556", "port: 8080"), r":4: master_agent\[1\]\.port \(MA MA2\):",
     "port 8080 on host localhost is taken by master_agent[0] (http_port)"),
    (("peer_hops: 1", "peer_keys: [k1]"), r":4: master_agent\[1\]\.peer_keys \(MA MA2\):",
     "1 key(s) for 2 peer(s): give one key per peer"),
    (("peer_hops: 1", "peer_hops: 7"), r":4: master_agent\[1\]\.peer_hops", "must be <= 4"),
    (("site-b:5555", "site-b"), r":4: master_agent\[1\]\.peers\[0\]",
     "'site-b' is not an address (the port is missing)"),
    (("peers: [site-b:5555, \"tcp://10.0.0.9:6000\"], ", ""), r":4: master_agent\[1\]\.peer_hops",
     "peer_hops without peers"),
    (("http_port: 8080}", "http_port: 8080, peer: [x:1]}"), r":3: master_agent\[0\]\.peer \(MA MA1\):",
     "unknown keys peer (did you mean peers?)"),
    (("  - {name: MA1, host: localhost, port: 5555, http_port: 8080}\n", "  - MA1\n"), r":3: master_agent\[0\]:",
     "must be a mapping"),
    (("{name: LA1, parent: MA2}", "{name: LA1, parent: MA3}"), r":6: local_agents\[0\]\.parent",
     "parent 'MA3' is not an agent of this deployment (agents: LA1, MA1, MA2)"),
])
def test_bad_lists_of_master_agents_are_clear(tmp_path, edit, where, words):
    assert edit[0] in TWO_MAS
    msg = problems(write(tmp_path, TWO_MAS.replace(*edit, 1)))
    assert re.search(where, msg) and words in msg, msg
    assert "Traceback" not in msg


def test_status_of_several_mas_reads_as_one_root():
    from gridrpc.deploy.runner import format_status

    def row(name, kind, parent):
        return {"name": name, "kind": kind, "parent": parent, "host": "localhost", "pid": 1, "process": "running",
                "tree": "alive", "address": None, "load": {}}
    text = format_status([row("MA1", "ma", None), row("MA2", "ma", None), row("LA1", "la", "MA2"),
                          row("sed-1", "sed", "LA1"), row("sed-2", "sed", "MA1")])
    names = [line[:24].strip(" ├└│─") for line in text.splitlines()[1:]]
    assert names == ["MA1", "MA2", "sed-2", "LA1", "sed-1"], text   # every child once, under the MAs
    assert "├─ sed-2" in text and "└─ LA1" in text and "   └─ sed-1" in text


def test_client_takes_one_key_per_master_agent(tmp_path):
    from gridrpc.client.aio import AsyncClient
    from gridrpc.transport.security import KeyStore
    store = KeyStore(tmp_path / "keys")
    for name in ("MA1", "MA2"):
        store.create(name, "element")
    store.create("alice", "user")
    c = AsyncClient("tcp://127.0.0.1:1,tcp://127.0.0.1:2", keys=str(store.dir), key="alice", ma_key="MA1,MA2")
    assert c._ma_public == [store.public("MA1", "element"), store.public("MA2", "element")]
    c = AsyncClient("tcp://127.0.0.1:1,tcp://127.0.0.1:2", keys=str(store.dir), key="alice", ma_key="MA2")
    assert c._ma_public == [store.public("MA2", "element")]          # one key: for every MA
    with pytest.raises(ConfigError, match="ma_key lists 2 keys for 3 master agent"):
        AsyncClient(["tcp://h:1", "tcp://h:2", "tcp://h:3"], keys=str(store.dir), key="alice", ma_key="MA1,MA2")


def sed_command(tmp_path, spec, name: str) -> list[str]:
    from gridrpc.deploy.runner import Deployment
    d = Deployment(spec, state_dir=str(tmp_path / "state"))
    d.addresses.update(MA="tcp://a:1", LA1="tcp://b:2")
    return d.command(spec.element(name))


def test_prestart_workers_reaches_the_sed_command_line_and_is_checked(tmp_path):
    spec = load(write(tmp_path, GOOD.replace("queue: fcfs}", "queue: fcfs, replicas: 4, prestart_workers: 4}")))
    assert spec.element("sed-1").options["prestart_workers"] == 4
    cmd = sed_command(tmp_path, spec, "sed-1")
    assert cmd[cmd.index("--prestart-workers") + 1] == "4"
    msg = problems(write(tmp_path, GOOD.replace("queue: fcfs}", "queue: fcfs, prestart_workers: -2}"), "b.yaml"))
    assert "seds[0].prestart_workers" in msg


def test_gather_needs_the_ethic_queue_and_reaches_the_command_line(tmp_path):
    spec = load(write(tmp_path, GOOD.replace("kill_grace: 1.5", "kill_grace: 1.5\n    gather: 0.02")))
    assert spec.element("sed-2").options["gather"] == 0.02
    cmd = sed_command(tmp_path, spec, "sed-2")
    assert cmd[cmd.index("--gather") + 1] == "0.02"
    msg = problems(write(tmp_path, GOOD.replace("queue: fcfs}", "queue: fcfs, gather: 0.02}"), "f.yaml"))
    assert "seds[0].gather" in msg and "applies to queue 'ethic' only" in msg
    msg = problems(write(tmp_path, GOOD.replace("kill_grace: 1.5", "gather: 99"), "g.yaml"))
    assert "seds[1].gather" in msg and "[0, 60]" in msg


def test_cpus_reaches_every_command_line_and_is_checked(tmp_path):
    text = (GOOD.replace("queue: fcfs}", "queue: fcfs, cpus: 0-1}")
            .replace("port: 5555, http_port: 8080}", "port: 5555, http_port: 8080, cpus: 1}")
            .replace("{name: LA1, parent: MA, host: localhost}", "{name: LA1, parent: MA, host: localhost, cpus: [1, 0]}"))
    spec = load(write(tmp_path, text))
    assert spec.element("sed-1").options["cpus"] == "0,1"
    assert spec.element("MA").options["cpus"] == "1" and spec.element("LA1").options["cpus"] == "0,1"
    cmd = sed_command(tmp_path, spec, "sed-1")
    assert cmd[cmd.index("--cpus") + 1] == "0,1"
    assert "--cpus" not in sed_command(tmp_path, spec, "sed-2")
    for bad in ("cpus: -1}", "cpus: 3-1}", "cpus: x}", "cpus: []}"):
        msg = problems(write(tmp_path, GOOD.replace("queue: fcfs}", f"queue: fcfs, {bad}"), "b.yaml"))
        assert "seds[0].cpus" in msg, msg


def test_status_prints_numbers_as_people_read_them():
    from gridrpc.deploy.runner import format_status
    row = {"name": "sed-1", "kind": "sed", "parent": None, "host": "localhost", "pid": 1, "process": "running",
           "tree": "alive", "address": None,
           "load": {"num_running": 1, "num_waiting": 0, "completed": 12, "free_cpu": 0.28400000000000003}}
    text = format_status([row])
    assert "free_cpu=0.284" in text and "0.28400000000000003" not in text, text
    assert "num_running=1 num_waiting=0 completed=12" in text, text     # integers stay integers
    from gridrpc.cli.values import format_number
    assert [format_number(v) for v in (1 / 3, 12345.678, 7, True, None)] == [
        "0.3333", "1.235e+04", "7", "True", "None"]


# -- back-end sections (kind: cloud, kind: batch) --------------------------------------

BACKENDS = """\
name: be
master_agent: {name: MA, host: localhost, port: 0}
seds:
  - {name: sed-1, parent: MA, services: [gridrpc.examples.services:add]}
  - name: cloud-1
    parent: MA
    kind: cloud
    provider: ec2
    image: ami-0123456789abcdef0
    instance_type: t3.micro
    services: [gridrpc.examples.services:add]
  - name: batch-1
    parent: MA
    kind: batch
    scheduler: slurm
    services: [gridrpc.examples.services:add]
"""


@pytest.mark.parametrize("old, new, line, field, words", [
    ("provider: ec2", "provider: azure", 8, "seds[1].provider", "unknown cloud provider 'azure'; known: ec2"),
    ("provider: ec2", "provider: openstack", 8, "seds[1].provider", "'openstack' is not implemented"),
    ("instance_type: t3.micro", "instance_typ: t3.micro", 10, "seds[1].instance_typ", "unknown cloud keys"),
    ("scheduler: slurm", "scheduler: pbs", 15, "seds[2].scheduler", "unknown scheduler 'pbs'; known: oar, sge, slurm"),
    ("scheduler: slurm", "scheduler: slurm\n    partitoin: debug", 16, "seds[2].partitoin",
     "did you mean partition"),
    ("scheduler: slurm", "scheduler: slurm\n    scheduler_options: {pe: smp}", 16, "seds[2].scheduler_options",
     "unknown scheduler option 'pe' for slurm"),
])
def test_deploy_up_refuses_a_bad_backend_section_before_starting_anything(tmp_path, old, new, line, field, words):
    """The real CLI: the file is refused when read, naming file, line and field;
    no element was started (no MA serving, no element log, no state)."""
    assert old in BACKENDS
    f = write(tmp_path, BACKENDS.replace(old, new))
    msg = problems(f)                                          # the validation alone (deploy up reads it so)
    assert f"{f}:{line}: {field}" in msg and words in msg, msg
    state = tmp_path / "st"
    r = subprocess.run([sys.executable, "-m", "gridrpc", "deploy", "up", str(f), "--state-dir", str(state),
                        "--ready-timeout", "10", "--register-timeout", "10"],
                       capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "Traceback" not in out, out
    assert f"{f}:{line}: {field}" in r.stderr and words in r.stderr, out
    assert "serving at" not in out and "starting" not in out, out
    assert not (state / "state.json").exists()
    assert not list(state.rglob("*.log")), list(state.rglob("*"))   # every element logs from its start


def test_a_good_backend_section_loads_and_non_idempotent_services_are_accepted(tmp_path):
    text = BACKENDS.replace("services: [gridrpc.examples.services:add]\n  - name: batch-1",
                            "services: [gridrpc.examples.services:add, "
                            "'gridrpc.examples.services:sleep,idempotent=false']\n  - name: batch-1")
    spec = load(write(tmp_path, text))
    assert spec.element("cloud-1").options["services"][-1] == "gridrpc.examples.services:sleep,idempotent=false"
    msg = problems(write(tmp_path, text.replace("idempotent=false", "idempotent=maybe"), "bad.yaml"))
    assert re.search(r"bad\.yaml:\d+: seds\[1\]\.services.*idempotent=maybe", msg), msg
