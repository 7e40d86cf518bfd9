"""Typing into the CLI's pane: literal text as a paste, and named keys from a fixed list. Nothing
a request sends ever reaches tmux's command parser or a shell. All calls block (a tmux client
runs), so the caller runs them in a worker thread.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Sequence

from sidecar.core.contract import INPUT_KEYS, MAX_INPUT_BYTES
from sidecar.pane.tmux import PANE, Tmux, TmuxError

# Text goes to `tmux load-buffer -` on the client's standard input, then `paste-buffer -p`
# (bracketed paste where the application enabled it, so a TUI takes it as one paste); keys are
# looked up in a fixed table of tmux key names. The argv is ours alone (fixed words and the pane
# id tmux gave us).
TMUX_TIMEOUT = 5.0
BUFFER = "sidecar-input"  # one named buffer, deleted by the paste (-d)
# Enter comes by a second tmux client once the CLI has drawn what was pasted, and a moment after:
# Gemini CLI takes an Enter as a newline, not a submission, while its guard after a paste holds
# (a 40 ms timer on 0.61, for terminals it does not trust with pastes). A fixed pause was not
# enough: a CLI that is busy (at its start, or on a loaded machine) reads the paste and the Enter
# in one go. Its own drawing of the text's end proves it has read the text; the Enter is sent
# after that. No wait can prove the guard has cleared: `sidecar.agent.prompt_submit` confirms a
# prompt's submission by the CLI's hook, and sends Enter again when none reported.
SUBMIT_GAP = 0.1  # seconds from seeing the echo to the Enter (Gemini's guard is 40 ms)
ECHO_WITHIN = 2.0  # a CLI that shows a paste otherwise (a placeholder) gets its Enter then
ECHO_POLL = 0.02
ECHO_TAIL = 16  # characters of the text's last line looked for on the screen
SUBMIT_AFTER = 0.3  # when the text has nothing to look for (only blanks)
# The contract's key names, mapped to tmux's. Digits and letters are tmux key names as they are.
TMUX_KEYS = {name: name for name in INPUT_KEYS} | {"Backspace": "BSpace"}
# Control characters a paste must not carry: an ESC could end a bracketed paste early and drive
# the TUI with what follows (C1 controls too). Tab, newline and carriage return are text.
FORBIDDEN = re.compile("[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]")


class InputError(Exception):
    """The input cannot be typed as given (the API answers 400)."""


class DeliveryError(Exception):
    """tmux did not take the input (the API answers 409: the pane is gone)."""


def check_text(text: str) -> bytes:
    """The text as UTF-8, or InputError saying what is wrong with it."""
    bad = FORBIDDEN.search(text)
    if bad is not None:
        msg = (
            f"invalid body: `text` holds control character U+{ord(bad.group()):04X} at "
            f"offset {bad.start()}; only tab, newline and carriage return are typed as text "
            "(send Escape and other keys with `keys`)"
        )
        raise InputError(msg)
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > MAX_INPUT_BYTES:
        msg = f"invalid body: `text` is {len(data)} bytes of UTF-8; at most {MAX_INPUT_BYTES}"
        raise InputError(msg)
    return data


def echo_tail(data: bytes) -> str:
    """What of a paste to look for on the screen once the CLI has drawn it: the end of its last
    line that is not blank, blanks collapsed ("" for a text of blanks)."""
    lines = [" ".join(line.split()) for line in data.decode(errors="replace").splitlines()]
    last = next((line for line in reversed(lines) if line), "")
    return last[-ECHO_TAIL:].strip()


def tmux_keys(keys: Sequence[str]) -> list[str]:
    try:
        return [TMUX_KEYS[k] for k in keys]
    except KeyError as exc:
        msg = f"invalid body: unknown key {exc.args[0]!r}; known: {', '.join(INPUT_KEYS)}"
        raise InputError(msg) from None


class PaneInput:
    """Types into the pane through tmux clients of the session's own (`Tmux.run_client`: with
    SIDECAR_USER they run as the CLI's user, never as root)."""

    def __init__(self, tmux: Tmux, target: str = PANE) -> None:
        self.tmux = tmux
        self.target = target

    def _run(self, args: list[str], stdin: bytes | None = None) -> None:
        try:
            done = self.tmux.run_client(args, stdin=stdin, timeout=TMUX_TIMEOUT)
        except (OSError, TmuxError, subprocess.TimeoutExpired) as exc:
            msg = f"tmux did not take the input: {exc}"
            raise DeliveryError(msg) from None
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
            msg = f"tmux did not take the input: {why}"
            raise DeliveryError(msg)

    def paste(self, data: bytes, *, submit: bool) -> None:
        """Paste `data` (bracketed where the application asked for it), then Enter once the
        CLI has drawn it."""
        if data:
            tail = echo_tail(data)
            before = self._screen().count(tail) if submit and tail else 0
            # One tmux client for the paste; ";" here is our own separator word.
            args = ["load-buffer", "-b", BUFFER, "-", ";"]
            args += ["paste-buffer", "-p", "-d", "-b", BUFFER, "-t", self.target]
            self._run(args, stdin=data)
            if submit and tail:
                self._wait_echo(tail, before)
            elif submit:
                time.sleep(SUBMIT_AFTER)
        if submit:
            self._run(["send-keys", "-t", self.target, "Enter"])

    def _screen(self) -> str:
        """The pane's visible text, wrapped lines joined and blanks collapsed ("" if tmux
        cannot say: the wait then ends at its deadline)."""
        try:
            done = self.tmux.run_client(
                ["capture-pane", "-p", "-J", "-t", self.target], timeout=TMUX_TIMEOUT
            )
        except (OSError, TmuxError, subprocess.TimeoutExpired):
            return ""
        return " ".join(done.stdout.decode(errors="replace").split())

    def _wait_echo(self, tail: str, before: int) -> None:
        """Until the screen shows `tail` once more than before the paste (at most
        ECHO_WITHIN), then SUBMIT_GAP."""
        deadline = time.monotonic() + ECHO_WITHIN
        while self._screen().count(tail) <= before:
            if time.monotonic() > deadline:
                return
            time.sleep(ECHO_POLL)
        time.sleep(SUBMIT_GAP)

    def keys(self, names: Sequence[str]) -> None:
        self._run(["send-keys", "-t", self.target, *tmux_keys(names)])
