"""Typing a prompt at the CLI's input prompt, and making sure it was submitted: `POST /input`'s
text and the inbox notices both type through here.

The Enter after a paste can be taken as a newline instead of a submission: Gemini CLI 0.61 does
that while its guard after a paste holds (a 40 ms timer that a busy machine can run late). So,
for a prompt typed at an idle agent, the Enter can go once more, and it submits the text the
newline left behind (or does nothing at an empty prompt). It must never answer a dialog the
prompt raised; the two ways to know the first Enter was not a submission:

- A CLI whose hooks report a submitted prompt (`Hooks.submit_event`) says it in that hook, and
  calls its model only once the hook has answered. If no submit hook has reported within
  CONFIRM_WITHIN, Enter goes once more. A submit hook that reports while this is decided waits
  for its answer (`settled`) until the second Enter is sent, so no dialog can come before it.
  That holds only for hooks that run: so this applies only once a hook of this launch has
  reported (a prompt typed right at the start may be confirmed by the start hook that reports
  meanwhile), and the Enter goes only once the screen shows the input prompt (Gemini runs its
  SessionStart hooks after drawing its prompt, and an Enter during them is a newline too).
- A CLI with no such hook (none, or turned off, or skipped: Gemini CLI ignores a settings file
  under a directory others can write) whose screen the sidecar knows shows it: the input
  prompt on screen, the cursor on a blank line right below the typed text (`typed_at`). Enter
  goes once more then, CONFIRM_WITHIN after the first or later; a prompt that has left the
  input was taken. (On the screen of a CLI not known, any program's output could look so.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from sidecar.agent.machine import AgentMachine
from sidecar.agent.screens import Reading, Screen, Seen, Typed, typed_at
from sidecar.core.states import ProcState
from sidecar.pane.protocol import ControlError
from sidecar.pane.send import PaneInput

log = logging.getLogger(__name__)

CONFIRM_WITHIN = 1.0  # seconds from the Enter to the submit hook, before Enter goes again
# Then, until the screen shows the input prompt again (Gemini runs its SessionStart hooks after
# drawing its prompt, and an Enter during them is a newline too): looked at this often, for at
# most this long. Without a submit hook, looked at so from CONFIRM_WITHIN after the Enter.
PROMPT_EVERY, PROMPT_WITHIN = 0.1, 3.0
# A line the CLI runs itself raises no submit hook: a slash command, a `!` shell line.
RUN_BY_THE_CLI = (b"/", b"!")


class PromptSubmit:
    def __init__(
        self,
        machine: AgentMachine,
        pane: PaneInput,
        look: Callable[[], Awaitable[tuple[Screen, Reading]]],
    ) -> None:
        self.machine = machine
        self.pane = pane
        self.look = look  # the screen now, and how the running CLI's recognizer reads it
        # Whether the running CLI's hooks report a submitted prompt (None: not known yet, no
        # hook of this launch has reported; set by the awareness).
        self.hooked: Callable[[], bool | None] = lambda: False
        # Whether the running CLI's screen is read with its own knowledge (a CLI not known may
        # be any program, whose input the screen cannot tell from its output; set by the
        # awareness).
        self.screen_known: Callable[[], bool] = lambda: False
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
        """Paste `data`, then Enter if `submit`; for a prompt typed at an idle agent, Enter once
        more when the first was taken as a newline (see above)."""
        confirm = (
            submit
            and self.machine.state == "idle"
            and bool(data.strip())
            and not data.lstrip().startswith(RUN_BY_THE_CLI)
        )
        hooked = self.hooked()
        if not confirm or (hooked is False and not self.screen_known()):
            await asyncio.to_thread(self.pane.paste, data, submit=submit)
            return
        self._heard.clear()
        if hooked is False:
            await asyncio.to_thread(self.pane.paste, data, submit=True)
            if await self._left_as_a_newline(data.decode("utf-8", "replace")):
                log.info("input: the Enter left the prompt in the CLI's input: Enter once more")
                await asyncio.to_thread(self.pane.keys, ["Enter"])
            return
        self._settled.clear()
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

    async def _left_as_a_newline(self, text: str) -> bool:
        """Whether the screen shows the Enter after `text` taken as a newline at the input
        prompt, CONFIRM_WITHIN after the Enter (the CLI's guard has long run out then) or
        within PROMPT_WITHIN more; False once the text is not by the cursor."""

        def newline_left(screen: Screen, reading: Reading) -> bool | None:
            typed = typed_at(screen, text)
            if typed is None:
                return False
            return True if typed is Typed.NEWLINE and reading.seen is Seen.PROMPT else None

        await asyncio.sleep(CONFIRM_WITHIN)
        return await self._screen_says(newline_left)

    async def _prompt_up(self) -> bool:
        """Whether the screen shows the CLI's input prompt, no submit hook reported and the CLI
        running, within PROMPT_WITHIN (the screen may show the CLI's own hooks running first)."""
        return await self._screen_says(lambda _, reading: reading.seen is Seen.PROMPT or None)

    async def _screen_says(self, decide: Callable[[Screen, Reading], bool | None]) -> bool:
        """What `decide` makes of the screen, looked at every PROMPT_EVERY for up to
        PROMPT_WITHIN until it says yes or no (None: look again); False once a submit hook
        reports, the CLI stops, or tmux cannot say (nothing is typed blind)."""
        for _ in range(round(PROMPT_WITHIN / PROMPT_EVERY)):
            if self._heard.is_set() or self.machine.process is not ProcState.RUNNING:
                return False
            try:
                screen, reading = await self.look()
            except ControlError:
                return False
            said = decide(screen, reading)
            if said is not None:
                return said
            if await self._hook_within(PROMPT_EVERY):
                return False
        return False
