"""Taking a deployment down: ``gridrpc deploy down``, and the roll-back of a
failed ``up``.

All hosts in parallel, one ssh session per host: SIGTERM to every element
(children listed before their parents), SIGKILL after ``stop_timeout``.
Elements that could not be stopped stay in the state directory (with the
reason in ``down_errors``) so a later ``down`` can retry.

:class:`TearDown` is a mixin of :class:`~gridrpc.deploy.runner.Deployment`.
"""
from __future__ import annotations

from ..errors import ConfigError, GridRPCError
from .state import first_line, per_host


class TearDown:
    """``down`` and the roll-back of a failed ``up`` (mixin)."""

    def _roll_back(self) -> None:
        """After a failed ``up``: stop every element started so far."""
        if self.started:
            self.progress(f"deploy failed: stopping the {len(self.started)} element(s) started ...")
            self.down(quiet=False)

    def down(self, quiet: bool = False) -> list[str]:
        """Stop every started element: all hosts in parallel, one ssh session
        per host (SIGTERM to all, children listed first, SIGKILL after
        ``stop_timeout``). Returns the names stopped; elements that could not
        be stopped stay in the state (see ``down_errors``) so a later
        ``down`` can retry."""
        stopped: list[str] = []
        self.down_errors = {}
        order = [e.name for level in reversed(self.spec.ordered()) for e in level if e.name in self.started]
        groups = self._by_host(order)

        def stop_host(hn: str) -> None:
            members = groups[hn]
            try:
                res = self.launcher(hn).stop_many([self.started[n] for n in members], timeout=self.stop_timeout)
            except (GridRPCError, ConfigError) as exc:
                ot = [self.spec.orphan_timeout_for(self.spec.element(n)) for n in members]
                hint = "" if any(v is None for v in ot) else (
                    f" (they exit by themselves {max(ot):g}s after losing their parent)")
                res = {self.started[n].pid: f"error: {first_line(exc)}{hint}" for n in members}
            for n in members:
                r = res.get(self.started[n].pid, "error: no answer")
                with self._lock:
                    if r.startswith("error"):
                        self.down_errors[n] = r[len("error: "):]
                    else:
                        stopped.append(n)
                if not quiet or r.startswith("error"):
                    self.progress(f"  {n} on {hn} (pid {self.started[n].pid}): {r}")

        per_host(stop_host, groups)
        with self._lock:
            for n in stopped:
                self.started.pop(n, None)
            state = self.state_dir / "state.json"
            if self.started:
                self._save_state()
            elif state.exists():
                state.unlink()
        return stopped
