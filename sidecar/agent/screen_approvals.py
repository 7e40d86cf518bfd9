"""Permission dialogs answered on screen: a permission prompt the screen shows with no request
listed for it (a CLI with no decision channel of its own; a CLI adopted after a supervisor crash,
whose held hook died with the old supervisor; a held hook released before the CLI's timeout) is
listed as an approval of source `screen`, and an answer to it is typed into the dialog with that
CLI's keys and confirmed by the agent leaving `waiting`. The dialog leaving the screen first means
a person answered it in the terminal: at work again, allowed; back at the prompt, denied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from sidecar.agent.approvals import Approvals, NotFound, Withdrawn
from sidecar.agent.knowledge import ApprovalKeys
from sidecar.agent.machine import AgentMachine
from sidecar.agent.registry import CLIDef
from sidecar.agent.screens import Seen
from sidecar.core.contract import Decision
from sidecar.core.shapes import InputAccepted, InputRequest

log = logging.getLogger(__name__)


class ScreenApprovals:
    def __init__(
        self,
        machine: AgentMachine,
        approvals: Approvals,
        deliver: Callable[[InputRequest], Awaitable[InputAccepted]],
    ) -> None:
        self.machine = machine
        self.approvals = approvals
        self.deliver = deliver
        self.keys: ApprovalKeys | None = None
        self.current: str | None = None  # the approval the dialog on screen answers
        self._covered = False  # the dialog on screen has (had) a request listed for it
        self._listing = "always"  # list dialogs from the screen: always, once, never
        self._tasks: set[asyncio.Task[None]] = set()

    def use(self, cli: CLIDef, *, channel: bool, adopted: bool) -> None:
        """`cli` runs now. `channel`: it has a decision channel of its own, whose requests
        arrive before their dialog is drawn, so a dialog is listed from the screen only when
        it was there before this supervisor (adopted after a crash: the held hook died)."""
        screen = cli.knowledge.screen if cli.knowledge is not None else None
        self.keys = screen.keys if screen is not None else None
        self.current, self._covered = None, False
        self._listing = "once" if channel and adopted else "never" if channel else "always"

    def looked(self) -> None:
        """The agent's state or the screen's reading changed."""
        reading = self.machine.reading
        showing = (
            self.machine.state == "waiting"
            and reading is not None
            and reading.seen is Seen.PERMISSION
        )
        if not showing:
            self._covered = False
            if self._listing == "once" and reading is not None:
                self._listing = "never"  # the dialog left over from before is gone
        elif self.approvals.pending():
            self._covered = True  # a request is listed: this dialog is its
        if (
            showing
            and reading
            and self.current is None
            and not self._covered
            and self._listing != "never"
        ):
            self._covered = True
            if self.keys is None:
                return  # a dialog the sidecar cannot answer: `waiting`, nothing listed
            tool, _, what = (reading.reason or "permission").partition(": ")
            asked = {"title": tool, "dialog": what or tool}  # what the dialog on screen says
            approval = self.approvals.request(tool, asked, source="screen")
            self.take(approval.id)
        elif not showing and self.current is not None and self.machine.state != "waiting":
            decision: Decision = "allow" if self.machine.state == "working" else "deny"
            if self.approvals.get(self.current) is not None:
                if self.machine.state in ("working", "idle"):
                    self.approvals.answered_by_terminal(self.current, decision)
                else:
                    self.approvals.withdraw(self.current, f"the agent is {self.machine.state}")
            self.current = None

    def take(self, approval_id: str) -> None:
        """Answer `approval_id` through the dialog on screen from now on."""
        if self.keys is None:
            return
        self.current = approval_id
        task = asyncio.create_task(self._answer(approval_id), name=f"approval-{approval_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, approval_id: str) -> None:
        try:
            answer = await self.approvals.decision(approval_id)
        except (Withdrawn, NotFound):
            return
        if answer.by == "terminal" or self.keys is None:
            return
        keys = list(self.keys(answer.decision, answer.remember))
        try:
            done = await self.deliver(InputRequest(keys=keys, if_state=["waiting"]))
        except Exception as exc:  # logged; the dialog stays for a person
            log.warning("approval %s: typing %s into the dialog failed: %s", approval_id, keys, exc)
            return
        if done.changed is not True:
            log.warning("approval %s: the dialog did not go away after %s", approval_id, keys)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
