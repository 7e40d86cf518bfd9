"""Agent state as the screen shows it, with the real Claude Code: how soon /events says what the
screen shows (a permission prompt drawn, answered, dismissed; a turn's end; a dialog; the trust
dialog at start-up), beside today's code and ccmanager, and Claude Code's CPU per prompt cycle.

Each arm's screen is polled from here (`capture-pane` every ~10 ms) and keys are sent as a
person would (`send-keys`, 0.5 s after a prompt is drawn). A state that does not come within
the round's cap counts as the cap and is named in the row (`never within N s`).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench import rigs
from bench.context import Context
from bench.core import REPORT, Baseline, Check, Figure, Target, at_most, ratio_at_most
from bench.procs import BenchError
from bench.rigs import SidecarRig, Timeline, TmuxRig

log = logging.getLogger(__name__)

PERMISSION = "Do you want to proceed?"
# The input prompt's footer says "? for shortcuts", or, while tmux's focus-events notice shows
# instead, "manual mode on" alone; while a turn runs it says "esc to interrupt".
READY = ("? for shortcuts", "manual mode on")
BUSY = "esc to interrupt"
TRUST = "Is this a project you created or one you trust?"
QUESTION = "Delete the build directory? [y/N]"
TOOL = "sleep 1; touch ran.txt"  # asks permission (a bare `sleep` does not), runs 1 s
PERSON = 0.5  # a person's pause before answering (Claude Code drops keys ~0.1 s after drawing)
LOOK = 1.0  # the state "with the dialog on screen": as reported this long after it was drawn
CPU_TAIL = 0.5  # the CPU window ends this long after the final answer is on screen
DIALOG_CAP = 2.0  # 4x the target: a dialog's `waiting` later than this counts as never
CCM = rigs.ccmanager()
LATENCY = ("permission", "answered", "escape", "end_of_turn", "dialog", "startup_waiting")
PEER = ("permission", "answered", "escape", "end_of_turn", "startup_waiting")
NAMES = (
    *(f"screen.{key}" for key in LATENCY),
    "screen.startup_state",
    "screen.cli_cpu",
    "screen.cli_cpu_today",
    *(f"screen.{key}.ccmanager" for key in (PEER if CCM else ())),
    *(["screen.startup_state.ccmanager"] if CCM else []),
)

Rig = SidecarRig | TmuxRig
Cycle = dict[str, float]


def _ready(text: str) -> bool:
    return any(r in text for r in READY) and BUSY not in text and PERMISSION not in text


def _sleep_until(when: float) -> None:
    time.sleep(max(0.0, when - time.time()))  # sleep-ok: a person's pause, a fixed window


def _since(value: float | None, start: float) -> float:
    return math.nan if value is None else value - start


def _submit(rig: Rig, prompt: str) -> float:
    """Type a prompt at Claude Code's input prompt and submit it; the time of the Enter."""
    rig.pane.wait(_ready, 30, "Claude Code's input prompt")
    rig.pane.keys(prompt, literal=True)
    rig.pane.wait(lambda s: prompt in s, 5, "the typed prompt")
    return rig.pane.keys("Enter")


def _answer(rig: Rig, key: str, drawn: float) -> float:
    """Press `key` on the permission prompt a person's pause after it was drawn; again if the
    prompt stays (a dropped key). The time of the key that took."""
    _sleep_until(drawn + PERSON)
    for _ in range(3):
        sent = rig.pane.keys(key)
        try:
            rig.pane.wait(lambda s: PERMISSION not in s, 2, "the prompt to go")
        except BenchError:
            log.debug("%s was not taken; again", key)
            continue
        return sent
    msg = f"the permission prompt did not take {key}"
    raise BenchError(msg)


def allow_cycle(rig: Rig, n: int, cap: float, states: bool = True) -> Cycle:
    """Prompt → permission prompt → Enter (allow) → the tool runs → final answer → idle."""
    assert rig.stub is not None
    reply = f"Done with round {n}."
    rig.stub.reply = reply
    pid = rig.cli_pid()
    cpu = rigs.tree_cpu(pid)
    sent = _submit(rig, f"run round {n}")
    drawn = rig.pane.wait(lambda s: PERMISSION in s, 30, "the permission prompt")
    out = {}
    if states:
        out["permission"] = _since(rig.states.first(_is("waiting"), sent, drawn + cap), drawn)
    key = _answer(rig, "Enter", drawn)
    if states:
        left = rig.states.first(lambda s: s != "waiting", key, key + cap)
        out["answered"] = 0.0 if rig.states.at(key) != "waiting" else _since(left, key)
    final = rig.pane.wait(lambda s: reply in s and _ready(s), 30, "the final answer")
    if states:
        out["end_of_turn"] = _since(rig.states.first(_is("idle"), key, final + cap), final)
    _sleep_until(final + CPU_TAIL)
    out["cpu"] = (rigs.tree_cpu(pid) - cpu) * 1000
    return out


def escape_cycle(rig: Rig, n: int, cap: float) -> Cycle:
    """Prompt → permission prompt → Escape → idle (no hook reports an Escape)."""
    _submit(rig, f"stop round {n}")
    drawn = rig.pane.wait(lambda s: PERMISSION in s, 30, "the permission prompt")
    key = _answer(rig, "Escape", drawn)
    return {"escape": _since(rig.states.first(_is("idle"), key, key + cap), key)}


def _is(state: str) -> Callable[[str], bool]:
    return lambda s: s == state


def _wait_state(states: Timeline, state: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while states.at(time.time()) != state:
        if time.time() > deadline:
            msg = f"the agent did not become {state} within {timeout:g}s"
            raise BenchError(msg)
        time.sleep(0.01)  # sleep-ok: polling interval of a deadline wait


def _asks(text: str) -> bool:
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return bool(lines) and lines[-1] == QUESTION


def dialog_cycle(rig: SidecarRig) -> Cycle:
    """`ask` in the dialog CLI → its question on screen → `waiting`; answered → idle."""
    _wait_state(rig.states, "idle", 10)
    rig.pane.keys("ask", literal=True)
    sent = rig.pane.keys("Enter")
    drawn = rig.pane.wait(_asks, 5, "the dialog CLI's question")
    waiting = rig.states.first(_is("waiting"), sent, drawn + DIALOG_CAP)
    rig.pane.keys("n", literal=True)
    rig.pane.keys("Enter")
    rig.pane.wait(lambda s: s.rstrip().endswith("ready>"), 5, "the dialog CLI's prompt")
    return {"dialog": _since(waiting, drawn)}


def startup_round(rig: Rig, start: Callable[[], float]) -> dict[str, Any]:
    """Claude Code started in a workspace it does not trust: the state with its trust dialog on
    screen, and when `waiting` came. `start` (re)starts the CLI on a cleared pane."""
    began = start()
    rig.pane.wait(lambda s: TRUST not in s, 10, "the pane cleared")
    drawn = rig.pane.wait(lambda s: TRUST in s, 30, "the trust dialog")
    _sleep_until(drawn + LOOK)
    shown = rig.states.at(time.time())
    waiting = rig.states.first(_is("waiting"), began, drawn + DIALOG_CAP)
    return {"shown": shown or "none", "waiting": _since(waiting, drawn)}


def _prompt_cycles(
    ctx: Context, tree: Path, rounds: int, cap: float
) -> dict[str, dict[str, list[float]]]:
    """Allow cycles in every arm, then escape cycles in those that report states: A B C A B C
    …; in a full run a first allow cycle each is discarded (a first turn's start-up costs)."""
    arms: dict[str, Rig] = {}
    out: dict[str, dict[str, list[float]]] = {}
    try:
        arms["ours"] = rigs.claude_sidecar(ctx.scratch("sc"), TOOL, None)
        arms["today"] = rigs.claude_sidecar(ctx.scratch("sc"), TOOL, tree)
        arms["alone"] = TmuxRig(ctx.scratch("cc"), TOOL).start()
        if CCM:
            arms["ccm"] = TmuxRig(ctx.scratch("cm"), TOOL, CCM).start()
        warmup = 0 if ctx.quick else 1
        for n in range(warmup + rounds):
            for name, rig in arms.items():
                got = allow_cycle(rig, n, cap, states=name != "alone")
                for key, value in got.items() if n >= warmup else ():
                    out.setdefault(name, {}).setdefault(key, []).append(value)
            for name, rig in arms.items():
                if n >= warmup and name != "alone":
                    out[name].setdefault("escape", []).append(escape_cycle(rig, n, cap)["escape"])
            log.debug("screen: round %d/%d", n + 1, warmup + rounds)
    finally:
        for rig in arms.values():
            rig.close()
    return out


def _dialogs(ctx: Context, tree: Path, rounds: int) -> dict[str, list[float]]:
    """The dialog CLI's question in our sidecar and today's, interleaved."""
    arms: dict[str, SidecarRig] = {}
    out: dict[str, list[float]] = {"ours": [], "today": []}
    try:
        arms["ours"] = rigs.dialog_sidecar(ctx.scratch("dl"), None)
        arms["today"] = rigs.dialog_sidecar(ctx.scratch("dl"), tree)
        for _ in range(rounds):
            for name, rig in arms.items():
                out[name].append(dialog_cycle(rig)["dialog"])
    finally:
        for rig in arms.values():
            rig.close()
    return out


def _startups(ctx: Context, tree: Path, rounds: int) -> dict[str, dict[str, list[Any]]]:
    """Trust-dialog rounds: our sidecar and today's (the CLI started again by a resleeve) and
    ccmanager (started again), interleaved."""
    arms: dict[str, tuple[Rig, Callable[[], float]]] = {}
    out: dict[str, dict[str, list[Any]]] = {}
    try:
        for name, path in (("ours", None), ("today", tree)):
            rig = rigs.claude_sidecar(ctx.scratch("st"), TOOL, path, trusted=False)
            arms[name] = (rig, rig.resleeve)
            rig.pane.wait(lambda s: TRUST in s, 30, "the first trust dialog")
        if CCM:
            ccm = TmuxRig(ctx.scratch("st"), TOOL, CCM, trusted=False)
            arms["ccm"] = (ccm, ccm.restart)
        for _ in range(rounds):
            for name, (arm, start) in arms.items():
                for key, value in startup_round(arm, start).items():
                    out.setdefault(name, {}).setdefault(key, []).append(value)
    finally:
        for arm, _ in arms.values():
            arm.close()
    return out


def run(ctx: Context) -> list[Figure]:
    rounds = ctx.pick(1, 5)
    cap = ctx.seconds(3.0, 5.0)
    tree = rigs.baseline_tree(ctx.scratch("base") / "tree")
    got = _prompt_cycles(ctx, tree, rounds, cap)
    for name, samples in _dialogs(ctx, tree, rounds).items():
        got[name]["dialog"] = samples
    shown = {}
    for name, seen in _startups(ctx, tree, rounds).items():
        got[name]["startup_waiting"] = seen["waiting"]
        shown[name] = seen["shown"]
    today = f"today's code, {rigs.BASELINE_COMMIT[:7]}"
    peer = f"ccmanager {rigs.ccmanager_version(CCM)}" if CCM else ""
    return _figures(got, shown, today, peer, _rows(cap))


def _capped(samples: list[float], cap: float) -> tuple[list[float], int]:
    never = sum(1 for s in samples if math.isnan(s))
    return [cap if math.isnan(s) else s for s in samples], never


def _never(count: int, total: int, cap: float) -> str:
    if not count:
        return ""
    if count == total:
        return f"; >{cap:g} s: never within the round"
    return f"; never within {cap:g} s in {count} of {total} rounds (the cap counted)"


def _latency(
    name: str, label: str, samples: tuple[list[float], list[float]], other_label: str, row: Row
) -> Figure:
    """A latency row: `nan` samples never came (counted as the cap and named); in a `signed`
    row a state published before the screen showed it (a hook first) counts as 0."""
    ours, other = samples
    ours_s, ours_never = _capped(ours, row.cap)
    other_s, other_never = _capped(other, row.cap)
    notes, extra = "", {}
    if row.signed:
        extra = {"signed_samples": ours_s, "baseline_signed_samples": other_s}
        notes = (
            "published before the screen showed it counts 0; signed medians: "
            f"{statistics.median(ours_s):+.3f} s vs {statistics.median(other_s):+.3f} s"
        )
        ours_s, other_s = [max(0.0, s) for s in ours_s], [max(0.0, s) for s in other_s]
    return Figure(
        name,
        label + _never(ours_never, len(ours), row.cap),
        "s",
        ours_s,
        baseline=Baseline(other_label + _never(other_never, len(other), row.cap), other_s),
        target=row.target,
        notes=notes,
        extra=extra,
    )


def _shown(states: list[str]) -> str:
    return ", ".join(f"{s} {states.count(s)}/{len(states)}" for s in dict.fromkeys(states))


def _startup_state(name: str, label: str, ours: list[str], other: list[str], who: str) -> Figure:
    """The correctness row: in how many rounds the state with the trust dialog up was
    `waiting`, with what each side reported."""
    return Figure(
        name,
        f"{label}: trust dialog at start-up, rounds reported `waiting` (ours: {_shown(ours)})",
        "",
        [float(ours.count("waiting"))],
        baseline=Baseline(f"{who}: {_shown(other)}", [float(other.count("waiting"))]),
        target=Target(f"all {len(ours)}", (Check("value", ">=", len(ours)),)),
        extra={"shown": ours, "baseline_shown": other},
    )


def _cpu(name: str, hooks: str, samples: list[float], alone: list[float]) -> Figure:
    return Figure(
        name,
        f"Claude Code's CPU per prompt cycle (prompt → permission → allow → answer), {hooks}",
        "ms",
        samples,
        baseline=Baseline("no hooks: `claude` alone in tmux, same stub", alone),
    )


def _figures(
    got: dict[str, dict[str, list[float]]],
    shown: dict[str, list[str]],
    today: str,
    peer: str,
    rows: dict[str, Row],
) -> list[Figure]:
    ours, base = got["ours"], got["today"]
    figures = [
        _latency(f"screen.{key}", f"screen: {row.label}", (ours[key], base[key]), today, row)
        for key, row in rows.items()
    ]
    figures += [
        _startup_state("screen.startup_state", "screen", shown["ours"], shown["today"], today),
        _cpu("screen.cli_cpu", "this tree's hooks", ours["cpu"], got["alone"]["cpu"]),
        _cpu("screen.cli_cpu_today", "today's hooks", base["cpu"], got["alone"]["cpu"]),
    ]
    if peer:
        vs, ahead = "screen vs ccmanager", ratio_at_most(1.0, "ahead of the peer (ratio ≤1)")
        figures += [
            _latency(
                f"screen.{key}.ccmanager",
                f"{vs}: {rows[key].label}",
                (ours[key], got["ccm"][key]),
                peer,
                replace(rows[key], target=ahead),
            )
            for key in PEER
        ]
        figures.append(
            _startup_state("screen.startup_state.ccmanager", vs, shown["ours"], shown["ccm"], peer)
        )
    return figures


@dataclass(frozen=True)
class Row:
    label: str
    target: Target
    cap: float
    signed: bool = False


def _rows(cap: float) -> dict[str, Row]:
    return {
        "permission": Row("permission prompt drawn → `waiting` on /events", REPORT, cap, True),
        "answered": Row(
            "answered prompt (Enter; its tool runs 1 s) → leaves `waiting`",
            at_most(1.0, "≤1 s"),
            cap,
        ),
        "escape": Row("Escape on a permission prompt → `idle`", at_most(1.0, "≤1 s"), cap),
        "end_of_turn": Row("final answer on screen → `idle`", REPORT, cap, True),
        "dialog": Row(
            "a dialog CLI's question drawn → `waiting` (`activity` source)",
            at_most(0.5, "≤500 ms after the pane settles"),
            DIALOG_CAP,
        ),
        "startup_waiting": Row(
            "trust dialog at start-up drawn → `waiting`",
            at_most(0.5, "≤500 ms after the pane settles"),
            DIALOG_CAP,
        ),
    }
