"""Security and access options of the ``gridrpc`` command (docs/security.md):
the daemons' CURVE settings (``--secure``, ``--keys``, ``--parent-key``,
``--insecure``), a SeD's authorization (``--allow``, ``--group``,
``--max-calls-per-user``) and a client's keys (``--keys``, ``--key``,
``--ma-key``): their arguments and what they turn into."""
from __future__ import annotations

import argparse
import logging
import os


def add_client_key_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keys", metavar="DIR", default=os.environ.get("GRIDRPC_KEYS"),
                   help="CURVE key directory of a secure tree (env GRIDRPC_KEYS); see docs/security.md")
    p.add_argument("--key", metavar="NAME", help="your key pair's name in --keys (default: your user name)")
    p.add_argument("--ma-key", metavar="NAME|FILE|KEY",
                   help="the MA's public key: element name in --keys (default MA), a .key file, or the key; "
                        "several MAs (--ma a,b): one per MA, comma-separated in the same order")


def client_security_options(a: argparse.Namespace) -> dict:
    """Client keywords from --keys/--key/--ma-key (empty without --keys)."""
    if not getattr(a, "keys", None):
        return {}
    out = {"keys": a.keys}
    if a.key:
        out["key"] = a.key
    if a.ma_key:
        out["ma_key"] = a.ma_key
    return out


def add_daemon_security_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("security (docs/security.md)")
    g.add_argument("--secure", action="store_true", default=os.environ.get("GRIDRPC_SECURE") == "1",
                   help="CurveZMQ on every link: only keys of --keys are accepted (env GRIDRPC_SECURE=1)")
    g.add_argument("--keys", metavar="DIR", default=os.environ.get("GRIDRPC_KEYS"),
                   help="key directory (gridrpc keys create ...; env GRIDRPC_KEYS)")
    g.add_argument("--parent-key", metavar="NAME|FILE|KEY",
                   help="the parent's public key: its element name in --keys, a .key file, "
                        "or 40 z85 characters (needed with --secure --parent)")
    g.add_argument("--insecure", action="store_true",
                   help="serve WITHOUT authentication on a non-loopback address (anyone who reaches the "
                        "port can register, call and read): only on a private, trusted network")


def add_access_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow", action="append", default=[], metavar="SERVICE=USERS",
                   help="only these users (comma-separated; @group allowed) may call SERVICE ('*': every "
                        "service not listed); repeatable. The user is the key's user under --secure")
    p.add_argument("--group", action="append", default=[], metavar="NAME=USERS", help="a group for --allow")
    p.add_argument("--max-calls-per-user", type=int, default=None, metavar="N",
                   help="calls in flight (queued or running) per user on this SeD")


def access_rules(a: argparse.Namespace):
    from ..errors import ConfigError
    from ..sed.access import AccessRules

    def pairs(items, flag):
        out = {}
        for item in items:
            k, sep, v = item.partition("=")
            if not sep or not k:
                raise ConfigError(f"{flag} expects NAME=USER1,USER2, got {item!r}")
            out[k] = [x for x in v.split(",") if x]
        return out
    return AccessRules.build(pairs(a.allow, "--allow"), pairs(a.group, "--group"), a.max_calls_per_user)


def security_kwargs(a: argparse.Namespace, parent: str | None) -> dict:
    """The daemon's CURVE settings from --secure/--keys/--parent-key; refuses
    to serve unauthenticated on a non-loopback address without --insecure."""
    from ..errors import ConfigError
    from ..transport.security import KeyStore, Security, is_loopback, public_key_from
    if not a.secure:
        if not is_loopback(a.host):
            if not a.insecure:
                raise ConfigError(
                    f"refusing to serve on {a.host} without authentication: anyone who reaches the port could "
                    "join the tree, impersonate users and run calls. Give --secure --keys DIR (docs/security.md), "
                    "or --insecure on a private network you trust")
            logging.getLogger("gridrpc.security").warning(
                "SECURITY IS OFF on %s (--insecure): no authentication, no encryption; any host that reaches "
                "this port can register elements, call services and read arguments and results", a.host)
        return {}
    if not a.keys:
        raise ConfigError("--secure needs a key directory: --keys DIR (or GRIDRPC_KEYS); "
                          "create keys with: gridrpc keys create NAME --element --dir DIR")
    store = KeyStore(a.keys)
    sec = Security(keys=store, name=a.name, role="element")
    sec.pair                                    # a missing key: a clear error now, not at the first peer
    kw: dict = {"security": sec}
    if parent:
        if not a.parent_key:
            raise ConfigError("--secure with --parent needs the parent's public key: --parent-key NAME "
                              "(its element name in --keys), a .key file, or the key itself")
        keys = []
        for spec in a.parent_key.split(","):          # one per parent (several MAs: --parent a,b)
            try:
                keys.append(store.public(spec.strip(), "element"))
            except ConfigError:
                keys.append(public_key_from(spec.strip()))
        kw["parent_key"] = keys[0] if len(keys) == 1 else keys
    return kw
