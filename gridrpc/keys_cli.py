"""``gridrpc keys``: create and list CurveZMQ key pairs (see docs/security.md)."""
from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("keys", help="create and list CURVE key pairs of elements and users",
                       description="Key pairs for CurveZMQ. Elements (MA, LAs, SeDs) and users each "
                                   "have one; a tree accepts only keys found in its key directory. "
                                   "Default directory: $GRIDRPC_KEYS or ~/.gridrpc/keys.")
    ks = p.add_subparsers(dest="keys_cmd", metavar="ACTION", required=True)
    c = ks.add_parser("create", help="create key pairs (refuses to overwrite)")
    c.add_argument("names", nargs="+", metavar="NAME")
    c.add_argument("--element", action="store_true", help="keys of tree elements (MA, LA, SeD), not users")
    c.add_argument("--dir", help="key directory")
    c.add_argument("--force", action="store_true", help="replace existing keys")
    l_ = ks.add_parser("list", help="list the keys of a directory")
    l_.add_argument("--dir", help="key directory")
    s = ks.add_parser("show", help="print one public key (to give to a client or a peer)")
    s.add_argument("name")
    s.add_argument("--element", action="store_true")
    s.add_argument("--dir", help="key directory")
    p.set_defaults(func=run)
    return p


def run(a: argparse.Namespace) -> int:
    from .errors import ConfigError
    from .transport.security import KeyStore
    store = KeyStore(a.dir)
    role = "element" if getattr(a, "element", False) else "user"
    try:
        if a.keys_cmd == "create":
            for name in a.names:
                path = store.create(name, role, overwrite=a.force)
                print(f"created {role} key {name}: {path} (secret: {path.with_suffix('.key_secret')})")
        elif a.keys_cmd == "list":
            entries = store.entries()
            if not entries:
                print(f"no keys in {store.dir} (create some: gridrpc keys create NAME [--element])")
            for r, name, public, has_secret in entries:
                print(f"{r:8s} {name:24s} {public.decode()}  {'secret here' if has_secret else 'public only'}")
        elif a.keys_cmd == "show":
            print(store.public(a.name, role).decode())
    except ConfigError as exc:
        print(f"gridrpc keys: error: {exc}", file=sys.stderr)
        return 2
    return 0
