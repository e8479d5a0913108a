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
    assert spec.ma.name == "MA"


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
