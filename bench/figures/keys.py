"""Keys into a dialog through `POST /input`, with the real Claude Code: for a permission prompt
that has been on screen for a second, how long the sidecar holds the key, how soon Enter makes
the agent leave `waiting` and Escape makes it `idle` (both on /events), and whether every key
was taken (the prompt gone from the screen within 2 s of the answer). Beside the code before
per-CLI key timing (KEYS_BASELINE: keys waited for 0.5 s of quiet pane, which Claude Code's
redraws every ~0.6 s made late), interleaved.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bench import rigs
from bench.context import Context
from bench.core import Baseline, Figure, Target, at_most, interleave
from bench.figures.screen import PERMISSION, TOOL, _is, _sleep_until, _submit
from bench.procs import BenchError, post_json

NAMES = ("keys.held", "keys.enter_leaves_waiting", "keys.escape_idle", "keys.lost")
# The commit before per-CLI key timing: the baseline these figures stand beside.
KEYS_BASELINE = "96cd5bc61856f5b4265a30ecb006905b1a3d7c5a"
ON_SCREEN = 1.0  # the prompt has been on screen this long when the key is sent
CAP = 3.0  # a state that does not come within this counts as this


def _key(rig: rigs.SidecarRig, n: int, key: str) -> dict[str, float]:
    """One prompt → permission prompt → `key` through POST /input a second later."""
    assert rig.stub is not None
    rig.stub.reply = f"Done with round {n}."
    _submit(rig, f"run round {n}" if key == "Enter" else f"stop round {n}")
    drawn = rig.pane.wait(lambda s: PERMISSION in s, 30, "the permission prompt")
    _sleep_until(drawn + ON_SCREEN)
    sent = time.time()
    code, body = post_json(rig.sc.port, "/input", {"keys": [key], "if_state": ["waiting"]}, 10)
    if code != 202:
        raise BenchError(f"POST /input {key}: {code} {body}")
    lost = 0.0
    try:
        rig.pane.wait(lambda s: PERMISSION not in s, 2, "the prompt to go")
    except BenchError:
        lost = 1.0  # not taken: a person would press it again
        rig.pane.keys(key)
        rig.pane.wait(lambda s: PERMISSION not in s, 5, "the prompt to go")
    if key == "Enter":
        left = rig.states.first(lambda s: s != "waiting", sent, sent + CAP)
        rig.pane.wait(lambda s: f"Done with round {n}." in s, 30, "the final answer")
    else:
        left = rig.states.first(_is("idle"), sent, sent + CAP)
    return {
        "held": float(body.get("held", 0.0)),
        "left": CAP if left is None else left - sent,
        "lost": lost,
    }


def run(ctx: Context) -> list[Figure]:
    tree = rigs.baseline_tree(ctx.scratch("kb") / "tree", KEYS_BASELINE)
    arms = {
        "ours": rigs.claude_sidecar(ctx.scratch("ko"), TOOL, None),
        "before": rigs.claude_sidecar(ctx.scratch("kp"), TOOL, tree),
    }
    rounds = iter(range(10**6))

    def cycle(rig: rigs.SidecarRig) -> Callable[[], dict[str, float]]:
        def both() -> dict[str, float]:
            n = next(rounds)
            enter, escape = _key(rig, n, "Enter"), _key(rig, n, "Escape")
            return {
                "held": enter["held"],
                "enter": enter["left"],
                "escape": escape["left"],
                "lost": enter["lost"] + escape["lost"],
            }

        return both

    try:
        got = interleave(ctx.pick(1, 10), {name: cycle(rig) for name, rig in arms.items()})
    finally:
        for rig in arms.values():
            rig.close()
    before = f"before per-CLI key timing ({KEYS_BASELINE[:7]})"

    def figure(key: str, name: str, label: str, unit: str, target: Target) -> Figure:
        return Figure(
            name,
            label,
            unit,
            got[f"ours.{key}"],
            baseline=Baseline(before, got[f"before.{key}"]),
            target=target,
        )

    on = f"a permission prompt on screen for {ON_SCREEN:g} s"
    rounds_run = len(got["ours.lost"])
    return [
        figure("held", "keys.held", f"keys: {on}, Enter held by POST /input", "s",
               at_most(0.02, "≤20 ms median")),
        figure("enter", "keys.enter_leaves_waiting",
               f"keys: {on}, POST /input Enter → leaves `waiting` (/events)", "s",
               at_most(0.1, "≤100 ms median")),
        figure("escape", "keys.escape_idle",
               f"keys: {on}, POST /input Escape → `idle` (/events)", "s",
               at_most(0.5, "≤500 ms median")),
        Figure(
            "keys.lost",
            f"keys: keys not taken, of {2 * rounds_run} (Enter and Escape, confirmed on screen)",
            "",
            [sum(got["ours.lost"])],
            baseline=Baseline(before, [sum(got["before.lost"])]),
            target=at_most(0.0, "none"),
        ),
    ]  # fmt: skip
