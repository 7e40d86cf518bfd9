"""The other CLIs' own signals against the activity guess, with the real Codex and opencode
against the loopback tool-call stub: a prompt typed through `POST /input` → `waiting` on /events
(the CLI asks permission for the stub's command), with each CLI's own source (Codex's hooks,
opencode's server events) and with `state: activity` for the same CLI (pane output and its
screen), interleaved. Each request is denied (Escape on screen, or through the API) so the next
round starts at the prompt. A `waiting` that does not come within CAP counts as CAP.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench.context import Context
from bench.core import REPORT, Baseline, Figure, interleave
from bench.procs import BenchError, get_json, make_sidecar, post_json, wait_until
from bench.rigs import SidecarRig
from tests.e2e.tool_stub import codex_config, opencode_config, running
from tests.harness import write_cli_config
from tests.tools import CLI_BIN

NAMES = ("clis.codex.waiting", "clis.opencode.waiting")
COMMAND = "touch bench-ran.txt"
CAP = 10.0


def _codex_home(home: Path, stub: int, workspace: Path) -> dict[str, str]:
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    (home / ".codex" / "config.toml").write_text(
        codex_config(f"http://127.0.0.1:{stub}/v1", str(workspace), "STUB_API_KEY")
    )
    return {"STUB_API_KEY": "stub-key"}


def _opencode_home(home: Path, stub: int, workspace: Path) -> dict[str, str]:
    config = home / ".config" / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(opencode_config(stub)))
    return {"OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1"}


HOMES: dict[str, Callable[[Path, int, Path], dict[str, str]]] = {
    "codex": _codex_home,
    "opencode": _opencode_home,
}


def _rig(tmp: Path, cli: str, stub: int, *, activity: bool) -> SidecarRig:
    env: dict[str, str] = {"PATH": f"{CLI_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    name = cli
    if activity:  # the same CLI, known by its pane's activity and its screen only
        name = f"{cli}-activity"
        entry = {"command": [cli], "prompt": True, "state": "activity"}
        env["SIDECAR_CLI_CONFIG"] = str(write_cli_config(tmp / "clis.yaml", {name: entry}))
    sc = make_sidecar(tmp / "sc", name, **env)
    sc.env_extra.update(HOMES[cli](sc.tmp / "home", stub, sc.workspace))
    return SidecarRig(sc).start()


def _cycle(rig: SidecarRig) -> float:
    port = rig.sc.port

    def state() -> str:
        return str(get_json(port, "/status")[1]["agent"]["state"])

    wait_until(lambda: state() == "idle", 60, "the agent idle")
    t0 = time.time()
    code, body = post_json(port, "/input", {"text": "run it", "if_state": ["idle"]})
    if code != 202:
        raise BenchError(f"POST /input: {code} {body}")
    seen = rig.states.first(lambda s: s == "waiting", t0, t0 + CAP)
    # Back to the prompt: deny through the API when the request is listed, else Escape.
    wait_until(lambda: state() in ("waiting", "idle"), 30, "the permission prompt")
    listed = get_json(port, "/approvals")[1]["approvals"]
    if listed:
        post_json(port, f"/approvals/{listed[0]['id']}", {"decision": "deny"})
    else:
        post_json(port, "/input", {"keys": ["Escape"], "if_state": ["waiting"]}, timeout=10)
    return (seen - t0) if seen is not None else CAP


def run(ctx: Context) -> list[Figure]:
    figures = []
    n = ctx.pick(1, 8)  # quick: one round each (an arm that never sees `waiting` waits CAP)
    with running(COMMAND) as stub:
        for cli in ("codex", "opencode"):
            if not (CLI_BIN / cli).exists():
                raise BenchError(f"{cli} is not installed in {CLI_BIN} (scripts/setup --test)")
            own = _rig(ctx.scratch(f"{cli}-own"), cli, stub, activity=False)
            guess = _rig(ctx.scratch(f"{cli}-act"), cli, stub, activity=True)
            try:
                arms = {
                    "own": functools.partial(_cycle, own),
                    "guess": functools.partial(_cycle, guess),
                }
                samples = interleave(n, arms)
            finally:
                own.close()
                guess.close()
            source = "hooks" if cli == "codex" else "events"
            p95 = statistics.quantiles(samples["own"], n=20)[-1] if n > 1 else samples["own"][0]
            figures.append(
                Figure(
                    f"clis.{cli}.waiting",
                    f"{cli}: prompt typed → `waiting` on /events ({source}; p95 {p95:.3f} s)",
                    "s",
                    samples["own"],
                    baseline=Baseline(
                        f"the same CLI with `state: activity` (cap {CAP:g} s)", samples["guess"]
                    ),
                    target=REPORT,
                )
            )
    return figures
