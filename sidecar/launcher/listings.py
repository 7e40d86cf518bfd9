"""`sleeve ps`, `sleeve instances` and `sleeve gc`: the runs recorded (with each running
sleeve's agent state and pending approvals), the instances kept per project, and removing those
whose project is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sidecar.launcher import instances, launch
from sidecar.launcher.commands import Settings, print_json, project_of
from sidecar.launcher.state import Run

# The HTTP client of `ps` (agents) is imported where it is used: every `sleeve` command pays for
# what it imports at start.
if TYPE_CHECKING:
    from sidecar.launcher.agents import Agent


def cmd_ps(args: argparse.Namespace, settings: Settings) -> int:
    from sidecar.launcher import agents

    runs = launch.observe(
        settings.home, docker=shutil.which("docker") is not None, adopt_bwrap=True
    )
    if args.project is not None:
        key = project_of(args, settings).key
        runs = [r for r in runs if r.project == key]
    found = agents.agents(runs)  # running sleeves only; bounded by agents.DEADLINE
    if args.json:
        print_json([_ps_record(r, found.get(r.id)) for r in runs])
        return 0
    if not runs:
        print("no sleeves recorded")
        return 0
    width = max(len("project"), *(len(r.project) for r in runs))
    row = "{:24}  {:>4}  {:7}  {:18}  {:>5}  {:>8}  {:8}  {}  {}"
    columns = _terminal_width(settings.env)
    print(row.format("run", "slot", "runtime", "status", "port", "started", "agent",
                     "project".ljust(width), "reason").rstrip())  # fmt: skip
    for r in runs:
        agent = found.get(r.id)
        started = instances.age(r.started_at)
        line = row.format(
            r.id, r.slot, r.runtime, r.status, r.port or "", started,
            agent.state if agent else "", r.project.ljust(width), "",
        )  # fmt: skip
        reason = agent.reason if agent and agent.reason else ""
        if reason and columns is not None:
            # Cut to what is left of the line, but never to nothing: a narrow terminal wraps.
            reason = agents.printable(reason, max(columns - len(line), 16))
        print((line + reason).rstrip())
        for pending in agent.approvals if agent else ():
            note = f"  approval {pending.id}  {pending.tool}: {pending.summary}"
            print(note if columns is None or len(note) <= columns else note[: columns - 1] + "…")
    if any(a.approvals for a in found.values()):
        print("answer: `sleeve approve NAME ID [--remember]`, `sleeve deny NAME ID` (NAME: run)")
    return 0


def _ps_record(run: Run, agent: Agent | None) -> dict[str, object]:
    """One run for `ps --json`: its record, and its agent's state and reason while it runs."""
    return {
        **dataclasses.asdict(run),
        "agent": agent.state if agent else None,
        "agent_reason": agent.reason if agent else None,
        "approvals": [dataclasses.asdict(p) for p in agent.approvals] if agent else None,
    }


def _terminal_width(env: Mapping[str, str]) -> int | None:
    """COLUMNS, else the terminal's width; None when stdout is no terminal (a pipe gets the
    whole reason, as `--json` does)."""
    value = env.get("COLUMNS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    if sys.stdout.isatty():
        with contextlib.suppress(OSError):
            return os.get_terminal_size(sys.stdout.fileno()).columns
    return None


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "K", "M", "G"):
        if size < 1024 or unit == "G":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{n}B"


def cmd_instances(args: argparse.Namespace, settings: Settings) -> int:
    found = instances.list_instances(settings.home)
    if args.json:
        print_json(
            [
                {
                    "sha16": i.sha,
                    "root": None if i.root is None else str(i.root),
                    "exists": i.root_exists,
                    "size": i.size,
                    "last_used": i.last_used,
                }
                for i in found
            ]
        )
        return 0
    if not found:
        print("no instances")
        return 0
    print(f"{'sha16':16}  {'exists':6}  {'size':>7}  {'last used':10}  root")
    for i in found:
        exists = "?" if i.root is None else {True: "yes", False: "no", None: "?"}[i.root_exists]
        root = "(no readable project-root)" if i.root is None else str(i.root)
        print(
            f"{i.sha:16}  {exists:6}  {_size(i.size):>7}  {instances.age(i.last_used):10}  {root}"
        )
    return 0


def cmd_gc(args: argparse.Namespace, settings: Settings) -> int:
    verb = "would remove" if args.dry_run else "removed"
    gone = instances.gc(settings.home, dry_run=args.dry_run)
    for root in gone:
        print(f"{verb} {root}", file=sys.stderr)
    if not gone:
        print("nothing to remove: every instance's project root is still there", file=sys.stderr)
    return 0
