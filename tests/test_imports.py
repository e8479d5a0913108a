"""Every module of the package can be imported first (no import cycles that
only work in one order)."""
import os
import subprocess
import sys
import textwrap

# each module is imported into a process with no gridrpc module loaded (third-party ones stay):
# the modules are split among processes run side by side, one per core (at most 4)
CODE = textwrap.dedent('''
    import importlib, pkgutil, sys
    import gridrpc
    part, parts = int(sys.argv[1]), int(sys.argv[2])
    names = [m.name for m in pkgutil.walk_packages(gridrpc.__path__, "gridrpc.")
             if ".static" not in m.name and not m.name.endswith(("locustfile", "__main__"))]
    bad = []
    for name in names[part::parts]:
        for k in [k for k in sys.modules if k == "gridrpc" or k.startswith("gridrpc.")]:
            del sys.modules[k]
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001
            bad.append(f"{name}: {type(exc).__name__}: {exc}")
    print(len(names))
    print(len(names[part::parts]))
    print("\\n".join(bad))
''')


def test_every_module_imports_first():
    parts = max(1, min(4, os.cpu_count() or 1))
    procs = [subprocess.Popen([sys.executable, "-c", CODE, str(i), str(parts)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(parts)]
    counts, done, bad = set(), 0, []
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0, err
            count, mine, *errors = out.strip().splitlines()
            counts.add(int(count))
            done += int(mine)
            bad += [b for b in errors if b]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert len(counts) == 1 and counts.pop() == done > 80, (counts, done)     # every module, once
    assert not bad, "\n".join(bad)


#: optional or heavy packages that no path below may import before it needs them
HEAVY = ("numpy", "scipy", "aiohttp", "pydantic", "yaml", "rich", "prometheus_client", "psutil")


def _loaded_after(code: str) -> list[str]:
    """The HEAVY packages imported once ``code`` has run in a fresh interpreter."""
    probe = f"import sys\n{code}\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return eval(r.stdout.strip().splitlines()[-1])


def test_import_gridrpc_loads_no_heavy_package():
    """The import budget, pinned by what is loaded rather than by a timing:
    ``import gridrpc`` and a client's start bring none of these (numpy alone
    took longer to import than the rest of the client)."""
    assert _loaded_after("import gridrpc") == []
    assert _loaded_after("import gridrpc\nc = gridrpc.Client('tcp://127.0.0.1:1', timeout=1)\nc.close()") == []
    assert _loaded_after("from gridrpc import AsyncClient, SeD, LocalAgent, File, DataRef, wait") == ["psutil"]
    # a path that needs numpy still gets it: an array decoded by the codec
    assert "numpy" in _loaded_after(
        "from gridrpc.core import codec\n"
        "tree = {'__t': 'nd', 'i': 0, 'dtype': '<i8', 'shape': [3], 'order': 'C'}\n"
        "assert codec.decode(tree, [bytes(24)]).tolist() == [0, 0, 0]")


def test_the_call_command_imports_only_what_it_runs():
    """``gridrpc call`` builds the parser of its own command: the modules of
    the other commands (deploy, sim, dashboard, ...) are not imported."""
    code = textwrap.dedent('''
        import sys
        from gridrpc.cli import build_parser
        a = build_parser("call").parse_args(["call", "add", "1", "2"])
        assert a.cmd == "call" and a.args == ["1", "2"]
        print(sorted(m for m in sys.modules if m.startswith(("gridrpc.deploy", "gridrpc.sim", "gridrpc.dashboard",
                                                            "gridrpc.experiments", "gridrpc.sed", "yaml", "rich"))))
    ''')
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_the_command_table_matches_the_full_parser():
    """Each lazily built command is registered by the module that the table names."""
    import argparse

    from gridrpc.cli import COMMAND_MODULES, build_parser

    def commands(ap):
        return [a for a in ap._actions if isinstance(a, argparse._SubParsersAction)][0].choices

    every = commands(build_parser())
    for name in every:
        assert name in commands(build_parser(name)), name
    for name in COMMAND_MODULES:
        assert list(commands(build_parser(name))) == [name]
    assert set(COMMAND_MODULES) <= set(every)
    assert set(every) - set(COMMAND_MODULES) == {"ma", "la", "sed", "call", "services", "discover", "demo"}
