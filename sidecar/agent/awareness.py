"""Agent awareness, wired together: the state machine (`agent`) fed by the running CLI's source
(`hook_source`, `event_source` or `activity_source`), `POST /input` (`input_delivery`) and the
inbox notices (`notify`) typing under one lock, what must survive a supervisor restart
(`agent_files`), the flight recorder (`recorder`) and the agent's bill and budget (`spending`).

The supervisor calls `launch_argv`, `process_changed`, `start`, `tick` and `stop`; the API
calls `deliver`, `hook_secret_matches`, `hook` and `look` (the screen, through the activity
source's tmux control client), and reads `recorder` and `spending`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from sidecar.agent.activity_source import ActivitySource
from sidecar.agent.approval_log import ApprovalLog
from sidecar.agent.approvals import Answer, Approvals
from sidecar.agent.event_source import EventSource
from sidecar.agent.hook_source import HookSource
from sidecar.agent.inbox_notices import InboxNotices
from sidecar.agent.input_delivery import InputDelivery
from sidecar.agent.machine import AgentMachine
from sidecar.agent.prompt_submit import PromptSubmit
from sidecar.agent.recorder import Recorder
from sidecar.agent.registry import CLIDef
from sidecar.agent.screen_approvals import ScreenApprovals
from sidecar.agent.screen_source import ScreenSource
from sidecar.agent.spending import Spending
from sidecar.agent.statefile import AgentFiles
from sidecar.audit.trail import AuditTrail
from sidecar.config import Config
from sidecar.core.contract import InputKey, screen_size
from sidecar.core.event_shapes import ScreenResized
from sidecar.core.events import EventBus
from sidecar.core.shapes import InputAccepted, InputRequest
from sidecar.core.states import ProcState
from sidecar.pane.control import PaneActivity
from sidecar.pane.screen import Screen, ScreenLook
from sidecar.pane.send import PaneInput
from sidecar.pane.tmux import Tmux
from sidecar.policy.paths import inside
from sidecar.record.redact import env_secrets
from sidecar.security.acting import Owner, acting
from sidecar.workspace.mailbox import Mailbox


class Awareness:
    def __init__(
        self,
        config: Config,
        bus: EventBus,
        tmux: Tmux,
        owner: Owner | None,
        audit: AuditTrail | None = None,
    ) -> None:
        self.bus = bus
        self.machine = AgentMachine(bus)
        self.approvals = Approvals(
            config.approval_timeout, ApprovalLog(bus, audit), policy=config.policy
        )
        if audit is not None:
            self.approvals.durable = audit.synced
        workspace = str(config.workspace)

        def resolve(path: str) -> str | None:
            with acting(owner):  # what the CLI's user can follow
                return inside(workspace, path)

        self.approvals.resolve = resolve
        self.files = AgentFiles(config.paths.agent_state)
        self.machine.session_id = self.files.load().session_id
        self.tmux = tmux
        self.activity = PaneActivity(
            tmux, self._output, self._attached, closely=lambda: self.machine.prompt_up
        )
        self.screen = ScreenLook(self.activity.ask, self._sized)
        # The screen confirms or corrects what the CLI's source says (sidecar.agent.screen_source).
        self.seen = ScreenSource(self.machine, self.screen.look)
        self.machine.on_report = self.seen.spoke
        pane = PaneInput(tmux)
        lock = asyncio.Lock()  # one writer to the pane at a time: inputs and notices
        submit = PromptSubmit(self.machine, pane, self.seen.look_and_read)
        self.notices = InboxNotices(
            config.inbox_notify,
            self.machine,
            files=self.files,
            inbox=Mailbox(config.workspace, "inbox", owner=owner),  # read as the CLI's user
            submit=submit,
            lock=lock,
            bus=bus,
        )
        self.hooks = HookSource(
            config,
            self.machine,
            self.files,
            self.approvals,
            on_idle=self.notices.check,
            on_silent=self._hooks_silent,
        )
        self.machine.on_state = self.hooks.state_changed
        self.quiet = ActivitySource(
            self.machine,
            self.activity.quiet_for,
            config.activity_quiet,
            self.notices.check,
            drawn=lambda: self.seen.drawn,
            look=self.seen.look_now,
        )
        self.events = EventSource(
            self.machine,
            self.files,
            self.approvals,
            self.notices.check,
            on_lost=self._fall_back,
            on_found=self._events_found,
        )
        self.input = InputDelivery(
            self.machine,
            self.activity,
            pane,
            lock,
            self.seen.read_now,
            look=lambda: self.seen.look_now(eager=True),
            submit=submit,
        )
        submit.hooked = lambda: self.hooks.reports_submissions
        submit.screen_known = lambda: self.seen.known
        self.hooks.prompts = submit
        self.on_screen = ScreenApprovals(self.machine, self.approvals, self.input.deliver)
        self.machine.on_look = self.on_screen.looked
        self.hooks.released = self.on_screen.take
        self._pane, self._lock = pane, lock
        self.spending = Spending(
            config, bus, self.machine, self.approvals, files=self.files, press=self._press
        )
        self.input.refuse_text = self.spending.refuse_text
        self.events.on_usage = lambda usage: self.spending.count([usage])
        self._config = config
        self.recorder = Recorder(
            config, bus, self.activity, self.files, self._secrets, size=lambda: self.tmux.size
        )
        self._cli: CLIDef | None = None
        self._task: asyncio.Task[None] | None = None

    def _use(self, cli: CLIDef, *, adopted: bool = False) -> None:
        self._cli = cli
        self.approvals.cli = cli.name
        self.seen.use(cli)
        self.hooks.use(cli)
        self.events.use(cli)
        self._screen_approvals(cli, adopted=adopted)
        self.notices.prompt = cli.prompt
        known = cli.knowledge.screen if cli.knowledge is not None else None
        self.input.keys_after = known.keys_after if known is not None else None
        self.machine.launched(cli.state)

    def _screen_approvals(self, cli: CLIDef, *, adopted: bool) -> None:
        """A dialog is listed from the screen when the CLI has no decision channel, or once
        after a crash for a CLI whose held hook died with it (an event stream is read again and
        lists what still waits itself)."""
        hooked = self.hooks.cli is not None and self.hooks.cli.decides
        channel = hooked or self.events.active
        self.on_screen.use(cli, channel=channel, adopted=adopted and hooked)

    # ---- the supervisor's side -----------------------------------------------------------------

    def launch_argv(
        self, cli: CLIDef, argv: tuple[str, ...], env: Mapping[str, str], *, has_history: bool
    ) -> tuple[tuple[str, ...], Mapping[str, str]]:
        """The argv and added environment to start `cli` with (`argv`: the registry's; `env`:
        the CLI's environment): a CLI with hooks gets ours and its pinned session."""
        self.quiet.launched(active=cli.state == "activity")
        self._use(cli)
        argv, added = self.hooks.launch(cli, argv, env, has_history=has_history)
        if self.events.active:
            argv, added = self.events.launch(cli, argv)
        args, reporting = self.spending.launch_env(cli, env)
        return (*argv, *args), {**added, **reporting}

    @property
    def own_server(self) -> tuple[str, int] | None:
        """The loopback address where the CLI just launched serves its own API (its TUI talks
        to it there), or None: it has none of ours."""
        return self.events.address if self.events.active else None

    def process_changed(
        self, state: ProcState, cli: CLIDef | None, *, why: str | None = None
    ) -> None:
        """The CLI's process changed state (`why`: why it does not run, when it does not)."""
        adopted = self._cli is None and cli is not None and state is ProcState.RUNNING
        if adopted and cli is not None:
            # A CLI this supervisor did not launch (adopted after a restart): same source.
            self.quiet.adopted(active=cli.state == "activity")
            self._use(cli, adopted=True)
            self.spending.use(cli, adopted=True)
        self.recorder.process_changed(state, cli.name if cli else None, adopted=adopted)
        if state is ProcState.STOPPING and self.files.record.hook_secret is not None:
            # Hooks of a CLI being stopped are refused from here on (a resleeve's old CLI).
            self.hooks.revoke()
        self.machine.process_changed(state, why)
        self.events.process_changed(state)
        if state is not ProcState.RUNNING:
            self.approvals.withdraw_all(f"the CLI is {state.value}")
        if state is ProcState.RUNNING:
            self.activity.attach()
            self.quiet.running()

    def start(self) -> None:
        self._task = asyncio.create_task(self.activity.run(), name="activity")

    async def stop(self) -> None:
        await self.recorder.stop()
        await self.spending.close()
        self.quiet.stop()
        await self.events.stop()
        self.seen.stop()
        await self.on_screen.stop()
        await self.activity.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def tick(self) -> None:
        """Once a second (the supervisor's tick): a notice, if one is due."""
        self.notices.check()

    @property
    def warnings(self) -> list[str]:
        """Why the agent's state is not known the way its CLI's entry says, why it is not
        recorded, why its spending is not counted (for /status)."""
        events = [self.events.warning] if self.events.warning else []
        return [*self.hooks.warnings, *events, *self.recorder.warnings, *self.spending.warnings]

    def _hooks_silent(self, silent: bool) -> None:
        """The running CLI's hooks are silent (or spoke again after all)."""
        if silent:
            self._fall_back()
        elif self._cli is not None:
            self.machine.source_changed("hooks")
            self.quiet.active = False
            self.quiet.stop()
            self._screen_approvals(self._cli, adopted=False)

    def _events_found(self) -> None:
        """The CLI's event stream, given up for, answered after all: it tells the state again
        and its requests are its own (listed from it, answered through it)."""
        self.machine.source_changed("events")
        self.quiet.active = False
        self.quiet.stop()
        if self._cli is not None:
            self._screen_approvals(self._cli, adopted=False)

    def _fall_back(self) -> None:
        """The CLI's hooks never reported, or its event stream is gone: its pane's activity
        tells its state beside its screen; what it said so far stands."""
        self.machine.source_changed("activity")
        self.quiet.adopted(active=True)
        if self._cli is not None:  # its dialogs are answered on screen from now on
            self.on_screen.use(self._cli, channel=False, adopted=False)
        self.quiet.running()

    def _output(self, now: float) -> None:
        self.quiet.output()
        self.seen.output(now)

    def _attached(self) -> None:
        self.seen.attached()
        self.recorder.attached()

    def _secrets(self) -> list[str]:
        """What no recording may hold: the API's tokens, this launch's secrets, the real values
        of SIDECAR_SECRETS_FILE, and the values of the CLI's variables that name a credential."""
        record, config = self.files.record, self._config
        ours = (config.token, config.view_token, record.hook_secret, record.telemetry_secret)
        real = [secret.value for secret in config.secrets]
        known = [s for s in (*ours, record.events_password, *real) if s]
        return [*known, *env_secrets(config.child_env)]

    async def _press(self, keys: tuple[InputKey, ...]) -> None:
        """Type `keys` into the CLI, under the lock every typing takes (the budget's interrupt)."""
        async with self._lock:
            await asyncio.to_thread(self._pane.keys, list(keys))

    # ---- the API's side ------------------------------------------------------------------------

    async def deliver(self, request: InputRequest) -> InputAccepted:
        """POST /input."""
        return await self.input.deliver(request)

    async def look(self) -> Screen:
        """GET /screen. Raises tmux_control.ControlError when tmux cannot be asked or refuses."""
        return await self.screen.look()

    async def resize(self, cols: int, rows: int) -> tuple[int, int]:
        """PUT /screen/size: the CLI's screen made `cols` x `rows`, within the contract's
        bounds; the size it has then. ControlError when tmux cannot be asked."""
        return await self.screen.resize(*screen_size(cols, rows))

    @property
    def screen_size(self) -> tuple[int, int]:
        """The CLI's screen, in columns and rows, as last seen or set."""
        return self.tmux.size

    def _sized(self, size: tuple[int, int]) -> None:
        """A look or a resize found the screen `size`: a new tmux server keeps it, and a change
        is told (a viewer fits its terminal to it)."""
        if size != self.tmux.size:
            self.tmux.size = size
            self.bus.publish(ScreenResized(cols=size[0], rows=size[1]))

    def hook_secret_matches(self, cli: str, given: str | None) -> bool:
        return self.hooks.secret_matches(cli, given)

    def hook_event_known(self, event: str) -> bool:
        """Whether `event` is one of the running CLI's hook events."""
        return self.hooks.knows(event)

    async def hook(self, event: str, payload: dict[str, Any]) -> dict[str, Any] | None:
        """POST /hooks/<cli>/<event>, its secret checked: the hook's reply, if it has one."""
        self.hooks.hook(event, payload)
        return await self.hooks.held(event, payload)

    def answer(self, approval_id: str, answer: Answer) -> Answer:
        """POST /approvals/<id>."""
        return self.approvals.answer(approval_id, answer)
