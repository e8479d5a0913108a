"""Who may call what on a SeD, and how much at once (the SeD's configuration).

``allow``: ``{service or "*": [user or "@group", ...]}`` — a service listed
(or ``*``) is callable only by those users; services not covered are open.
``groups``: ``{group: [users]}``. ``max_calls_per_user``: calls in flight
(queued or running) per user on this SeD process. The user is the key's user
under security (docs/security.md); without security it is the name the
client gives, so these rules then only guard against mistakes, not attacks.
A refusal names the rule.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..core.messages import valid_name
from ..errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class AccessRules:
    allow: dict = field(default_factory=dict)        # service | "*" -> frozenset of users / "@group"
    groups: dict = field(default_factory=dict)       # group -> frozenset of users
    max_calls_per_user: int | None = None

    @classmethod
    def build(cls, allow: dict | None = None, groups: dict | None = None,
              max_calls_per_user: int | None = None) -> "AccessRules":
        def names(what, items):
            if isinstance(items, str):
                items = [x for x in items.split(",") if x]
            if not isinstance(items, (list, tuple, set, frozenset)) or not all(isinstance(x, str) for x in items):
                raise ConfigError(f"{what}: a list of user names")
            return frozenset(x.strip() for x in items)
        g = {str(k): names(f"groups.{k}", v) for k, v in (groups or {}).items()}
        a = {str(k): names(f"allow.{k}", v) for k, v in (allow or {}).items()}
        for svc, who in a.items():
            for w in who:
                if w.startswith("@") and w[1:] not in g:
                    raise ConfigError(f"allow.{svc}: unknown group {w!r} (groups: {', '.join(sorted(g)) or 'none'})")
        for grp in g:
            if not valid_name(grp):
                raise ConfigError(f"group name {grp!r}: letters, digits, '_', '.', '-'")
        if max_calls_per_user is not None and (isinstance(max_calls_per_user, bool)
                                               or not isinstance(max_calls_per_user, int) or max_calls_per_user < 1):
            raise ConfigError("max_calls_per_user must be a positive integer")
        return cls(allow=a, groups=g, max_calls_per_user=max_calls_per_user)

    def _members(self, who: frozenset) -> set:
        out = set()
        for w in who:
            out |= self.groups.get(w[1:], frozenset()) if w.startswith("@") else {w}
        return out

    def check(self, service: str, user: str, in_flight: dict) -> str | None:
        """Why ``user`` may not call ``service`` now, or None."""
        who = self.allow.get(service, self.allow.get("*"))
        if who is not None and user not in self._members(who):
            rule = service if service in self.allow else "*"
            return (f"user {user!r} may not call {service!r} (allow rule for {rule!r}: "
                    f"{', '.join(sorted(who))})")
        n = in_flight.get(user, 0)
        if self.max_calls_per_user is not None and n >= self.max_calls_per_user:
            return (f"user {user!r} has {n} calls in flight here (limit max_calls_per_user="
                    f"{self.max_calls_per_user})")
        return None


OPEN = AccessRules()
