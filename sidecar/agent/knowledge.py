"""All the sidecar and the launcher know of one AI CLI, declared once by its package under
`sidecar.agent.clis` (`Knowledge`), and the registry entry a CLI runs from (`CLIDef`). A package
that declares something inconsistent fails as it is imported, with one line naming it and the field.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, get_args

from sidecar.agent.event_stream import EventStream
from sidecar.agent.hooks import Hooks
from sidecar.agent.screens import Recognizer, Seen
from sidecar.config import ConfigError
from sidecar.core.contract import INPUT_KEYS, InputKey, StateSource
from sidecar.usage.telemetry import Telemetry

if TYPE_CHECKING:  # the init process imports the registry: no asyncio in it
    from sidecar.core.contract import Decision

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
STATE_SOURCES: tuple[str, ...] = get_args(StateSource)
#: Whether a CLI has history for a workspace, given the environment it runs with.
History = Callable[[Mapping[str, str], Path], bool]


class KnowledgeError(ConfigError):
    """A CLI package's declaration contradicts itself (raised as the package is imported)."""


@dataclass(frozen=True)
class ApprovalKeys:
    """The keys (`POST /input`'s names) that answer the CLI's permission dialog on screen."""

    once: tuple[InputKey, ...]  # allow this request
    always: tuple[InputKey, ...]  # allow, and don't ask again (for this session)
    deny: tuple[InputKey, ...]

    def __call__(self, decision: Decision, remember: bool) -> tuple[InputKey, ...]:
        if decision == "deny":
            return self.deny
        return self.always if remember else self.once


@dataclass(frozen=True)
class ScreenKnowledge:
    """How the CLI's screen reads: its recognizer, the readings it gives (a shape it does not
    know is a dialog: `sidecar.agent.screens`), and the keys that answer its permission dialog."""

    read: Recognizer
    shows: frozenset[Seen]
    keys: ApprovalKeys | None = None
    # Seconds after it draws a prompt for a person that the prompt takes keys (measured per
    # CLI: some drop what comes sooner); None: not known, keys wait for the pane to be quiet.
    keys_after: float | None = None


@dataclass(frozen=True)
class Homes:
    """What a slot keeps of the CLI (config, sign-in, conversations): paths under the sleeve's
    HOME, which the launcher makes in the slot and mounts there, in this order."""

    dirs: tuple[str, ...] = ()
    # Under one of `dirs`, kept per project (the launcher's instance) rather than per slot, and
    # mounted over the slot's: the conversations follow the project into any slot.
    project_dirs: tuple[str, ...] = ()
    project_files: tuple[str, ...] = ()
    files: Mapping[str, str] = field(default_factory=dict)  # a file and the text it starts with
    sign_in: str | None = None  # the file a signed-in slot holds (under one of `dirs`)
    # The Kubernetes Secret (`<name>-<seed>`) a pod seeds `sign_in` from, once.
    seed: str | None = None

    def paths(self) -> tuple[str, ...]:
        return (*self.dirs, *self.project_dirs, *self.project_files, *self.files)


@dataclass(frozen=True)
class Knowledge:
    """One CLI, as its package declares it: its registry entry (`name` ... `state`), its launch
    (hooks or event stream), its screen and approval keys, its resume rule and its slot's homes.
    `package` is the module that declares it (named in its errors)."""

    package: str
    name: str  # the registry's name, and its hooks' URL segment
    command: tuple[str, ...]
    resume: tuple[str, ...] | None = None  # the argv that continues its conversation
    # Resume exactly when it has history for the workspace, first start included (a hard
    # resleeve: a new container, the same history); without it, resume on a restart.
    history: History | None = None
    prompt: bool = True  # takes typed lines: inbox notices are typed into it
    state: StateSource = "activity"
    # command[0] is the sidecar's login shell ($SHELL) rather than a program of its own.
    login_shell: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    hooks: Hooks | None = None
    events: EventStream | None = None
    screen: ScreenKnowledge | None = None
    homes: Homes = Homes()
    # How it reports its usage (tokens, cost) to the sidecar; None: it reports none.
    telemetry: Telemetry | None = None
    # The keys a person presses to stop the turn under way (the budget presses them, once).
    interrupt: tuple[InputKey, ...] = ("C-c",)

    def __post_init__(self) -> None:
        found = self._problem()
        if found is not None:
            where, what = found
            msg = f"CLI package {self.package}: {where}: {what}"
            raise KnowledgeError(msg)

    @property
    def program(self) -> str:
        """The program its command runs (a registry YAML entry running it gets this knowledge)."""
        return PurePosixPath(self.command[0]).name if self.command else ""

    def entry(self, login_shell: str) -> CLIDef:
        """Its registry entry (`login_shell`: the sidecar's $SHELL)."""
        command = (login_shell, *self.command[1:]) if self.login_shell else self.command
        return CLIDef(
            self.name,
            command,
            self.resume,
            self.env,
            resume_needs_history=self.history is not None,
            prompt=self.prompt,
            state=self.state,
            knowledge=self,
        )

    def _problem(self) -> tuple[str, str] | None:
        unknown = [k for k in self.interrupt if k not in INPUT_KEYS]
        if not self.interrupt or unknown:
            return "interrupt", f"{unknown or 'none'}: not POST /input's key names"
        for check in (self._entry_problem, self._source_problem, self._screen_problem):
            if (found := check()) is not None:
                return found
        return _homes_problem(self.homes)

    def _entry_problem(self) -> tuple[str, str] | None:
        if not NAME_RE.match(self.name):
            return "name", f"{self.name!r} does not match {NAME_RE.pattern}"
        for where, argv in (("command", self.command), ("resume", self.resume)):
            if argv is not None and (not argv or not all(a and "\x00" not in a for a in argv)):
                return where, "must be an argv of non-empty strings"
        if self.history is not None and self.resume is None:
            return "history", "a history rule needs a resume argv"
        return None

    def _source_problem(self) -> tuple[str, str] | None:
        if self.state not in STATE_SOURCES:
            return "state", f"{self.state!r} is none of {', '.join(STATE_SOURCES)}"
        if self.state == "hooks" and self.hooks is None:
            return "state", "hooks, but it declares no hooks"
        if self.state == "events" and self.events is None:
            return "state", "events, but it declares no event stream"
        if self.hooks is not None and self.events is not None:
            return "events", "a CLI's state has one source: hooks or an event stream"
        return self.hooks.problem() if self.hooks is not None else None

    def _screen_problem(self) -> tuple[str, str] | None:
        screen = self.screen
        if screen is None:
            return None
        if Seen.PERMISSION in screen.shows and screen.keys is None:
            return "screen.keys", "its screen shows a permission dialog, and no keys answer it"
        if Seen.PERMISSION not in screen.shows and screen.keys is not None:
            return "screen.keys", "keys for a permission dialog its screen never shows"
        keys = screen.keys
        if keys is None:
            return None
        for name, value in (("once", keys.once), ("always", keys.always), ("deny", keys.deny)):
            unknown = [k for k in value if k not in INPUT_KEYS]
            if not value or unknown:
                return f"screen.keys.{name}", f"{unknown or 'none'}: not POST /input's key names"
        return None


def _homes_problem(homes: Homes) -> tuple[str, str] | None:
    for path in homes.paths():
        parts = PurePosixPath(path).parts
        if not path or path.startswith("/") or ".." in parts or path != str(PurePosixPath(path)):
            return "homes", f"{path!r} is not a plain path under HOME"
    under = [*homes.project_dirs, *homes.project_files, *([homes.sign_in] if homes.sign_in else [])]
    for path in under:
        if not any(PurePosixPath(path).is_relative_to(d) for d in homes.dirs):
            return "homes", f"{path!r} is under none of its dirs"
    if homes.seed is not None and homes.sign_in is None:
        return "homes.seed", "a seed needs a sign_in file"
    return None


# `resume` is the argv used when the CLI is started again in the same workspace (resleeve,
# self-healing, a hard resleeve with history). `prompt` marks an interactive prompt that takes
# typed lines (inbox notices); `state` says how the agent's state is known
# (`sidecar.agent.machine`): `hooks` (the CLI's own hooks), `events` (its server's event
# stream), `activity` (pane output) or `none`. `knowledge` is the package's that knows the CLI
# (None: the generic screen reading, told the CLI's input prompt by `prompt_pattern`).
@dataclass(frozen=True)
class CLIDef:
    name: str
    command: tuple[str, ...]
    resume: tuple[str, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    # Resume only when the CLI has history for this workspace (claude --continue fails without).
    resume_needs_history: bool = False
    prompt: bool = False  # takes typed lines: inbox notices are typed into it
    state: StateSource = "activity"
    knowledge: Knowledge | None = None
    prompt_pattern: re.Pattern[str] | None = None

    def argv(self, *, resume: bool, has_history: bool) -> tuple[str, ...]:
        """The argv to run. `resume` asks for the resume argv (resleeve, restart, self-heal).
        A CLI whose history can be checked resumes exactly when it has history, first start
        included (a hard resleeve: a new container with the same history)."""
        if self.resume is None:
            return self.command
        if self.resume_needs_history:
            return self.resume if has_history else self.command
        return self.resume if resume else self.command

    def has_history(self, env: Mapping[str, str], workspace: Path) -> bool:
        """Whether the CLI has history for `workspace` (False: it cannot be told)."""
        knowledge = self.knowledge
        if knowledge is None or knowledge.history is None:
            return False
        return knowledge.history({**env, **self.env}, workspace)
