"""Typing a prompt at the CLI's input prompt, and making sure it was submitted: `POST /input`'s
text and the inbox notices both type through here.

The Enter after a paste can be taken as a newline instead of a submission: Gemini CLI 0.61 does
that while its guard after a paste holds (a 40 ms timer that a busy machine can run late), and
nothing on screen says when the guard has cleared. A CLI whose hooks report a submitted prompt
(`Hooks.submit_event`) says it in that hook, and calls its model only once the hook has
answered. So, for a prompt typed at an idle agent: if no submit hook has reported within
CONFIRM_WITHIN, Enter goes once more. It submits the text the newline left behind, or does
nothing at an empty prompt (a submission whose hook is only slow). It can never answer a dialog
this prompt raised: a submit hook that reports while this is decided waits for its answer
(`settled`) until the second Enter is sent, and no dialog can come before the model is called.
That holds only for hooks that run: so the second Enter goes only once a hook of this launch has
reported (hooks turned off in the user's config report nothing, and the CLI's dialog would come
with no hook before it; a prompt typed right at the start may be confirmed by the start hook
that reports meanwhile), and only once the screen shows the input prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from sidecar.agent.machine import AgentMachine
from sidecar.agent.screens import Reading, Seen
from sidecar.core.states import ProcState
from sidecar.pane.protocol import ControlError
from sidecar.pane.send import PaneInput

log = logging.getLogger(__name__)

CONFIRM_WITHIN = 1.0  # seconds from the Enter to the submit hook, before Enter goes again
# Then, until the screen shows the input prompt again (Gemini runs its SessionStart hooks after
# drawing its prompt, and an Enter during them is a newline too): looked at this often, for at
# most this long.
PROMPT_EVERY, PROMPT_WITHIN = 0.1, 3.0
# A line the CLI runs itself raises no submit hook: a slash command, a `!` shell line.
RUN_BY_THE_CLI = (b"/", b"!")


class PromptSubmit:
    def __init__(
        self, machine: AgentMachine, pane: PaneInput, read: Callable[[], Awaitable[Reading]]
    ) -> None:
        self.machine = machine
        self.pane = pane
        self.read = read  # the screen as the running CLI's recognizer reads it, now
        # Whether the running CLI's hooks report a submitted prompt (None: not known yet, no
        # hook of this launch has reported; set by the awareness).
        self.hooked: Callable[[], bool | None] = lambda: False
        self._settled = asyncio.Event()  # clear while a submission is being confirmed
        self._settled.set()
        self._heard = asyncio.Event()  # a submit hook reported since the paste

    def heard(self) -> None:
        """A submit hook reported (the hook source tells, before it answers the hook)."""
        self._heard.set()

    async def settled(self) -> None:
        """Until no submission is being confirmed (a submit hook's answer waits for it)."""
        await self._settled.wait()

    async def paste(self, data: bytes, *, submit: bool) -> None:
        """Paste `data`, then Enter if `submit`; for a prompt typed at an idle agent whose
        hooks report submissions, Enter once more when none was reported."""
        confirm = (
            submit
            and self.machine.state == "idle"
            and bool(data.strip())
            and not data.lstrip().startswith(RUN_BY_THE_CLI)
            and self.hooked() is not False
        )
        if not confirm:
            await asyncio.to_thread(self.pane.paste, data, submit=submit)
            return
        self._settled.clear()
        self._heard.clear()
        try:
            await asyncio.to_thread(self.pane.paste, data, submit=True)
            if await self._hook_within(CONFIRM_WITHIN) or not await self._prompt_up():
                return
            if self.hooked() is not True:
                return  # no hook heard at all: nothing says a dialog would wait for one
            log.info(
                "input: no submit hook within %.1f s of the Enter: Enter once more",
                CONFIRM_WITHIN,
            )
            await asyncio.to_thread(self.pane.keys, ["Enter"])
        finally:
            self._settled.set()

    async def _hook_within(self, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._heard.wait(), seconds)
        return self._heard.is_set()

    async def _prompt_up(self) -> bool:
        """Whether the screen shows the CLI's input prompt, no submit hook reported and the CLI
        running, within PROMPT_WITHIN (the screen may show the CLI's own hooks running first)."""
        for _ in range(round(PROMPT_WITHIN / PROMPT_EVERY)):
            if self._heard.is_set() or self.machine.process is not ProcState.RUNNING:
                return False
            try:
                if (await self.read()).seen is Seen.PROMPT:
                    return True
            except ControlError:
                return False  # tmux cannot say: nothing is typed blind
            if await self._hook_within(PROMPT_EVERY):
                return False
        return False
