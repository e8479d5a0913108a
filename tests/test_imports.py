"""Every module of the package can be imported first (no import cycles that
only work in one order)."""
import subprocess
import sys
import textwrap


def test_every_module_imports_first():
    code = textwrap.dedent('''
        import importlib, pkgutil, sys
        import gridrpc
        names = [m.name for m in pkgutil.walk_packages(gridrpc.__path__, "gridrpc.")
                 if ".static" not in m.name and not m.name.endswith(("locustfile", "__main__"))]
        bad = []
        for name in names:
            for k in [k for k in sys.modules if k == "gridrpc" or k.startswith("gridrpc.")]:
                del sys.modules[k]
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001
                bad.append(f"{name}: {type(exc).__name__}: {exc}")
        print(len(names))
        print("\\n".join(bad))
    ''')
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    count, *bad = r.stdout.strip().splitlines()
    assert int(count) > 80
    assert not [b for b in bad if b], "\n".join(bad)
