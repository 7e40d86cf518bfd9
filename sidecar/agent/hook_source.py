"""A CLI's hooks as the agent's state source (`sidecar.agent.hooks` says what each CLI declares):
each launch gets a new hook secret, a settings file of ours that carries it and the session
arguments that pin its conversation; the events its hooks report are checked against that secret
and applied to the agent's state, and a permission request is held until it is answered.

A CLI whose hooks never report (a version that rejects ours, hooks turned off in the user's
config) is noticed, and its state comes from the screen and the pane's activity, with a warning,
until a hook reports after all.

A held request is answered by whoever comes first: the API (or the timeout policy), whose answer
the hook returns to the CLI, or a person in the CLI's own dialog, which the CLI takes at once and
which shows as the agent leaving `waiting` (at work: allowed; back at its prompt: denied). The
CLI gives up on the hook after its own timeout: the hook is released just before, unanswered,
and the request stays listed for a person at the terminal.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from sidecar.agent.approvals import Approvals, Withdrawn
from sidecar.agent.hooks import HookLaunch, Hooks, hook_base_url
from sidecar.agent.machine import AgentMachine
from sidecar.agent.prompt_submit import PromptSubmit
from sidecar.agent.registry import CLIDef
from sidecar.agent.statefile import AgentFiles
from sidecar.config import Config
from sidecar.core.contract import AgentStateName
from sidecar.core.files import write_new
from sidecar.security.acting import Owner, acting

log = logging.getLogger(__name__)

# Hooks that never report (a version that rejects our hook config) are noticed: a CLI whose
# hooks report at its start gets SILENT_AFTER seconds from it (longer while a first-start dialog
# holds it up), any CLI SILENCE seconds from a turn begun at its input prompt. Its state then
# comes from the screen and pane activity, until a hook reports after all.
SILENT_AFTER = 15.0
SILENCE = 10.0


class HookSource:
    def __init__(
        self,
        config: Config,
        machine: AgentMachine,
        files: AgentFiles,
        approvals: Approvals,
        *,
        on_idle: Callable[[], None],
        on_silent: Callable[[bool], None],
    ) -> None:
        self.config = config
        self.machine = machine
        self.files = files
        self.approvals = approvals
        self.on_idle = on_idle  # the agent went idle: an inbox notice may be due
        self.cli: Hooks | None = None  # the running CLI's, when it has hooks
        self.name = ""  # the running CLI's knowledge name: its hooks' URL segment
        # Where the CLI's user reads it (the session dir with SIDECAR_USER), as that user's.
        self._settings_owner = (
            Owner(config.user.uid, config.user.gid, act_as=True) if config.user else None
        )
        self._held: set[str] = set()  # approvals whose hook is held open now
        # A request whose hook was released unanswered: answered on screen from then on.
        self.released: Callable[[str], None] = lambda approval_id: None
        # Root's, in the user's group (no chown: the group comes from the thread's fsgid).
        self._root_owner = Owner(0, config.user.gid, act_as=True) if config.user else None
        # The running CLI's hooks are silent (True: the screen and activity tell its state).
        self.on_silent = on_silent
        self.silent = False
        # Launched with our hooks, none heard yet (an adopted CLI's were heard by the last one).
        self._unheard = False
        self._silence: asyncio.TimerHandle | None = None
        # Told of each submit hook; its answer waits until a typed prompt's submission is
        # confirmed (set by the awareness).
        self.prompts: PromptSubmit | None = None

    @property
    def reports_submissions(self) -> bool | None:
        """Whether the running CLI's hooks report a submitted prompt: it has a submit hook and
        a hook of this launch has reported (hooks turned off report nothing). None: not known
        yet (none has reported since the launch)."""
        if self.cli is None or self.cli.submit_event is None or self.silent:
            return False
        return None if self._unheard else True

    def use(self, cli: CLIDef) -> None:
        """The CLI that runs now (launched or adopted)."""
        known = cli.knowledge
        self.cli = known.hooks if known is not None and cli.state == "hooks" else None
        self.name = known.name if known is not None and self.cli is not None else ""
        self._unheard = False
        self._forget_silence()

    def _arm(self, delay: float, *, at_start: bool) -> None:
        if self._silence is not None:
            self._silence.cancel()
        loop = asyncio.get_running_loop()
        self._silence = loop.call_later(delay, self._silent, at_start)

    def _silent(self, at_start: bool) -> None:
        self._silence = None
        if not self._unheard or self.cli is None:
            return
        if at_start and self.machine.screen_needs_person:
            self._arm(SILENT_AFTER, at_start=True)  # a first-start dialog: no hooks before it
            return
        log.warning("%s: its hooks are silent; its state comes from screen and activity", self.name)
        self.silent = True
        self.on_silent(True)

    def _heard(self) -> None:
        """A hook reported: back from the fallback, if the hooks were silent."""
        was_silent = self.silent
        self._unheard = False
        self._forget_silence()
        if was_silent:
            self.on_silent(False)

    def _forget_silence(self) -> None:
        if self._silence is not None:
            self._silence.cancel()
            self._silence = None
        self.silent = False

    @property
    def warnings(self) -> list[str]:
        """For /status: the running CLI's hooks never reported."""
        if not self.silent or self.cli is None:
            return []
        return [
            f"{self.name}: no hook reported (this version rejected the sidecar's hook "
            "config, or its user turned hooks off?); its state comes from the screen and pane "
            "activity until one does"
        ]

    def launch(
        self, cli: CLIDef, argv: tuple[str, ...], env: Mapping[str, str], *, has_history: bool
    ) -> tuple[tuple[str, ...], Mapping[str, str]]:
        """The argv and added environment to start `cli` with (`env`: the CLI's environment):
        our hook settings and its pinned session. A new hook secret for every launch."""
        self.use(cli)
        hooks = self.cli
        if hooks is None:
            self.revoke()
            return argv, {}
        record = self.files.record
        pinned = record.session_id if record.session_cli == cli.name else None
        secret = secrets.token_urlsafe(32)
        root = hooks.root_settings
        settings_path = self.config.paths.hook_settings(self.name, root_owned=root)
        with acting(self._settings_owner):  # it may read the user's own files (history)
            launched = hooks.launch(
                HookLaunch(
                    command=cli.command,
                    argv=argv,
                    env={**env, **cli.env},
                    base_url=hook_base_url(self.config.host, self.config.port, self.name),
                    secret=secret,
                    settings_path=settings_path,
                    session_id=pinned,
                    workspace=self.config.workspace,
                    has_history=has_history,
                )
            )
        self.files.update(session_id=launched.session_id, session_cli=cli.name, hook_secret=secret)
        self._unheard = True
        if hooks.reports_at_start:
            self._arm(SILENT_AFTER, at_start=True)
        self.machine.session_id = launched.session_id
        # The file holds the secret: 0600, made as the CLI's user (with SIDECAR_USER; the
        # sidecar keeps the secret in memory and in its own state dir, never reads it back);
        # a file the CLI takes only from root is root's, 0640 in the user's group.
        shared = root and self._root_owner is not None
        with acting(self._root_owner if root else self._settings_owner):
            document = json.dumps(launched.settings, indent=1).encode()
            write_new(settings_path, document, 0o640 if shared else 0o600)
        return launched.argv, launched.env

    def revoke(self) -> None:
        """Refuse hooks from here on (the CLI runs without hooks, or is being stopped)."""
        self.files.update(hook_secret=None)
        self._forget_silence()

    def secret_matches(self, cli_name: str, given: str | None) -> bool:
        """Constant-time check of a hook call's secret against the running CLI's."""
        expected = self.files.record.hook_secret
        if given is None or expected is None or self.cli is None or self.name != cli_name:
            return False
        return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode())

    def knows(self, event: str) -> bool:
        """Whether `event` is one of the running CLI's hook events."""
        return self.cli is not None and event in self.cli.events

    def hook(self, event: str, payload: dict[str, Any]) -> None:
        """A hook event from the running CLI (its secret was checked)."""
        if self.cli is None:
            return
        self._heard()
        if event == self.cli.submit_event and self.prompts is not None:
            self.prompts.heard()
        effect = self.cli.interpret(event, payload)
        if effect.session_id is not None and effect.session_id != self.machine.session_id:
            # --continue picked a conversation: pin it from now on.
            self.machine.session_id = effect.session_id
            self.files.update(session_id=effect.session_id)
        if effect.state is None or (effect.state == "waiting" and self._decided(event, payload)):
            return  # the policy answers this request at once: nobody is waited for
        reason = effect.reason
        if effect.restates and effect.state == self.machine.state:
            reason = self.machine.status().reason  # the first word on it named the tool
        self.machine.report(effect.state, reason)
        if effect.state == "idle":
            self.on_idle()

    def _decided(self, event: str, payload: dict[str, Any]) -> bool:
        """A permission request the policy will answer at once (`held` asks it again)."""
        ask = self.cli.permission(event, payload) if self.cli is not None else None
        if ask is None:
            return False
        verdict = self.approvals.verdict(self.approvals.facts(ask.tool, ask.input, "hooks"))
        return self.approvals.applies(verdict, "hooks")

    async def held(self, event: str, payload: dict[str, Any]) -> dict[str, Any] | None:
        """The reply to a hook the CLI waits on: a permission request's answer, once given
        (None: no decision, the CLI asks its person)."""
        hooks = self.cli
        if hooks is not None and event == hooks.submit_event and self.prompts is not None:
            await self.prompts.settled()
        ask = hooks.permission(event, payload) if hooks is not None else None
        if hooks is None or ask is None:
            return None
        approval = self.approvals.request(ask.tool, ask.input, source="hooks", key=ask.key)
        self._held.add(approval.id)
        try:
            answer = await asyncio.wait_for(self.approvals.decision(approval.id), hooks.max_hold)
        except TimeoutError:
            log.warning(
                "approval %s: released the hook unanswered before the CLI's own timeout; "
                "it stays listed for the terminal",
                approval.id,
            )
            self.released(approval.id)
            return None
        except Withdrawn:
            return None
        finally:
            self._held.discard(approval.id)
        return hooks.answer(answer, payload) if answer.by != "terminal" else None

    def state_changed(self, state: AgentStateName, previous: AgentStateName) -> None:
        """The agent left `waiting` with a held request unanswered: a person answered it in
        the CLI (at work again: allowed; at its prompt: denied), or the CLI went away. A turn
        begun at the input prompt that no hook announced starts the wait for the hooks' first
        word (a first-start dialog runs none)."""
        turn = previous == "idle" and state in ("working", "waiting")
        if turn and self._unheard and self._silence is None:
            self._arm(SILENCE, at_start=False)
        if previous != "waiting" or state == "waiting":
            return
        for approval_id in list(self._held):
            if state == "working":
                self.approvals.answered_by_terminal(approval_id, "allow")
            elif state == "idle":
                self.approvals.answered_by_terminal(approval_id, "deny")
            else:
                self.approvals.withdraw(approval_id, f"the agent is {state}")
