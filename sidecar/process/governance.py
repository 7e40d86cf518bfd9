"""The rules of the sleeve while it runs: the audit trail every decision goes to, the policy and
the allow file read again on SIGHUP (a file refused on reload keeps what was in force, and says
so once: a log line, an event, a `/status` warning until a good file is read), and the egress
proxy's held requests wired to the approvals (`SIDECAR_EGRESS_ASK`).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from sidecar.agent.approvals import Approvals
from sidecar.agent.egress_approvals import EgressApprovals
from sidecar.audit.records import PolicyChangedRecord, ResleeveRecord
from sidecar.audit.trail import AuditTrail
from sidecar.config import EGRESS_FILE_VAR, POLICY_VAR, Config
from sidecar.core.event_shapes import ErrorEvent, Event, PolicyChanged, Resleeve
from sidecar.core.events import EventBus
from sidecar.egress.allowlist import AllowlistError, parse_list, read_file
from sidecar.egress.service import Egress
from sidecar.policy.load import PolicyError, read_policy
from sidecar.policy.rules import Policy

log = logging.getLogger(__name__)


def open_trail(config: Config, bus: EventBus) -> AuditTrail:
    """The audit trail in SIDECAR_AUDIT_DIR (the state dir by default). A disk that refuses it
    is an `error` event (and a `/status` warning while it lasts), never a stop."""

    def problem(text: str | None) -> None:
        if text is not None:
            bus.publish(ErrorEvent(message=text))

    trail = AuditTrail(config.audit_path, config.sleeve_name, on_problem=problem)
    trail.open()
    return trail


class Governance:
    def __init__(
        self,
        config: Config,
        bus: EventBus,
        approvals: Approvals,
        egress: Egress,
        audit: AuditTrail,
    ) -> None:
        self.config = config
        self.bus = bus
        self.approvals = approvals
        self.egress = egress
        self.audit = audit
        self._refused: dict[str, str] = {}  # variable -> why its file was refused on reload
        self._task: asyncio.Task[None] | None = None
        self._again = False  # a SIGHUP came while a reload was reading
        self.asks: EgressApprovals | None = None
        if config.egress_ask is not None and egress.proxy is not None:
            self.asks = EgressApprovals(approvals, config.egress_ask, self._remember)
            egress.use_asker(self.asks.ask)
        if config.policy is not None and config.policy_file is not None:
            self._policy_record(config.policy_file, config.policy, "start")
        bus.listen(self._event)

    @property
    def warnings(self) -> list[str]:
        """For /status: a file refused on reload, a trail the disk refuses."""
        out = [
            f"{var}: {why}; the one read before stays in force"
            for var, why in self._refused.items()
        ]
        if self.audit.problem is not None:
            out.append(self.audit.problem)
        return out

    def _remember(self, pattern: str) -> None:
        try:
            self.egress.change([pattern], [], "approval")
        except AllowlistError as exc:  # a host the list's syntax cannot hold (checked already)
            log.warning("egress approval: %s not added to the list: %s", pattern, exc)

    def _event(self, event: Event) -> None:
        """A finished resleeve, from the bus (process/resleeve.py publishes it)."""
        if isinstance(event, Resleeve) and event.phase == "done":
            pid = event.pid if isinstance(event.pid, int) else None
            self.audit.write(ResleeveRecord(previous=event.previous, cli=event.cli, pid=pid))

    # ---- SIGHUP ---------------------------------------------------------------------------------

    def reload(self) -> None:
        """Read the allow file and the policy file again (SIGHUP). One reload at a time; a SIGHUP
        that comes during one makes it read both files once more when it is done, so a change
        saved while a reload was reading is never left unread."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._reload(), name="reload")

    async def _reload(self) -> None:
        again = True
        while again:
            self._again = False
            log.info("SIGHUP: reading the allow file and the policy again")
            if self.config.egress_file is not None:
                await self._reload_allowlist(self.config.egress_file)
            if self.config.policy_file is not None:
                await self._reload_policy(self.config.policy_file)
            again = self._again
            log.info("SIGHUP: done%s", "; asked again meanwhile, reading again" if again else "")

    async def _reload_allowlist(self, path: Path) -> None:
        try:
            texts = await asyncio.to_thread(read_file, EGRESS_FILE_VAR, path)
            allow = parse_list(EGRESS_FILE_VAR, texts)
        except AllowlistError as exc:
            self._refuse(EGRESS_FILE_VAR, str(exc).removeprefix(f"{EGRESS_FILE_VAR}: "))
            return
        self._refused.pop(EGRESS_FILE_VAR, None)
        self.egress.replace(allow)

    async def _reload_policy(self, path: Path) -> None:
        try:
            policy = await asyncio.to_thread(read_policy, path)
        except PolicyError as exc:
            if not self._refuse(POLICY_VAR, str(exc)):
                return  # said already
            self.bus.publish(PolicyChanged(file=str(path), rules=self._rules(), error=str(exc)))
            self.audit.write(
                PolicyChangedRecord(
                    file=str(path), by="reload", rules=self._rules(), error=str(exc)
                )
            )
            return
        self._refused.pop(POLICY_VAR, None)
        self.approvals.policy = policy
        log.info(
            "policy read again from %s: %d rules, default %s",
            path,
            len(policy.rules),
            policy.default,
        )
        self.bus.publish(PolicyChanged(file=str(path), rules=len(policy.rules)))
        self._policy_record(path, policy, "reload")

    def _rules(self) -> int:
        policy = self.approvals.policy
        return len(policy.rules) if policy is not None else 0

    def _policy_record(self, path: Path, policy: Policy, by: str) -> None:
        self.audit.write(
            PolicyChangedRecord(
                file=str(path),
                by="start" if by == "start" else "reload",
                rules=len(policy.rules),
                default=policy.default,
            )
        )

    def _refuse(self, var: str, why: str) -> bool:
        """A file refused on reload: said once (log, event, the /status warning); False when
        it was said already."""
        if self._refused.get(var) == why:
            return False
        self._refused[var] = why
        log.warning("%s: %s; the one read before stays in force", var, why)
        self.bus.publish(ErrorEvent(message=f"{var} refused on reload: {why}"))
        return True

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.audit.close()
