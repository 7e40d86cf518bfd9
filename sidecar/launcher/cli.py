"""`sleeve`: the host launcher's command line (its subcommands, their options and help) and
`main`, which runs one subcommand (`commands`, `listings`, `build`, `approve`) and turns a
LauncherError into exit 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence

from sidecar.launcher import runtimes
from sidecar.launcher.approve import cmd_approve, cmd_deny
from sidecar.launcher.build import cmd_build
from sidecar.launcher.commands import (
    Settings,
    cmd_create,
    cmd_manifest,
    cmd_rm,
    cmd_run,
    cmd_slots,
    cmd_stop,
)
from sidecar.launcher.fsutil import LauncherError
from sidecar.launcher.listings import cmd_gc, cmd_instances, cmd_ps

EPILOG = """\
state lives in $SLEEVE_HOME (default ~/.sleeve).
stopping: `sleeve stop N` sends SIGTERM (bwrap: through the waiter to the sandbox's PID 1;
docker: `docker stop`) and waits; `sleeve rm N --force` stops a running slot, then removes it.
run statuses in `sleeve ps`: starting, running, completed (exit 0), failed (code N),
failed (vanished) (gone without an exit code), stopped (ended by `sleeve stop`).
agent and reason in `sleeve ps`: each running sleeve's agent state and what it waits for, from
its /status (asked with its token, all at once, 1.5 s at most); `?` when it does not answer.
A waiting agent's permission requests follow its row (`approval ID  TOOL: what it would do`);
`sleeve approve NAME ID` / `sleeve deny NAME ID` answer one through that sleeve's API.
"""


class _Subcommands:
    """Adds subcommands that all take `--project`, and `--json` where they list."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self._sub = parser.add_subparsers(dest="command", required=True)

    def add(
        self,
        name: str,
        func: Callable[[argparse.Namespace, Settings], int],
        text: str,
        *,
        listing: bool = False,
        project_default: str | None = ".",
    ) -> argparse.ArgumentParser:
        p = self._sub.add_parser(name, help=text, description=text)
        p.add_argument(
            "--project",
            default=project_default,
            metavar="PATH",
            help="project directory (default: the current directory)",
        )
        if listing:
            p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=func)
        return p


def _add_slot_commands(subs: _Subcommands) -> None:
    subs.add("create", cmd_create, "create a slot (reuses the first dead one)", listing=True)
    subs.add("slots", cmd_slots, "prune the counter, then list the project's slots", listing=True)
    p = subs.add("rm", cmd_rm, "remove slot N's directory")
    p.add_argument("slot", type=int, metavar="N")
    p.add_argument("--force", action="store_true", help="stop it first if it is running")
    p = subs.add("stop", cmd_stop, "stop the sleeve running in slot N")
    p.add_argument("slot", type=int, metavar="N")
    p.add_argument(
        "--grace",
        type=float,
        help="seconds before SIGKILL (default: the sleeve's SIDECAR_STOP_GRACE rounded up, + 5)",
    )


def _add_sleeve(p: argparse.ArgumentParser, *, slot: str, image: str) -> None:
    """What `run` and `manifest` both ask: the slot, the CLI and its goal, the image, egress.
    `slot` and `image`: their help."""
    p.add_argument("--slot", type=int, metavar="N", help=f"this slot (default: {slot})")
    p.add_argument("--cli", default="claude-code", help="CLI to run (default claude-code)")
    p.add_argument("--goal", metavar="TEXT", help="task for the sleeve (SLEEVE_GOAL)")
    p.add_argument("--image", default="sleeve:latest", help=f"{image} (default %(default)s)")
    p.add_argument(
        "--egress",
        default="default",
        metavar="default|open|FILE",
        help="the hosts the agent may reach: the CLI's default list (default), open (no "
        "limit), or a file of patterns",
    )
    p.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="NAME=FILE[,env=VAR][,hosts=HOST;HOST]",
        help="a credential the agent sees only as a placeholder; the sidecar's proxy sends the "
        "real value (FILE) to HOSTs only. Known names: anthropic, claude, openai, gemini, "
        "github (docs/launcher.md). Repeatable",
    )


def _add_run(subs: _Subcommands) -> None:
    p = subs.add("run", cmd_run, "start a sleeve in the first free slot")
    _add_sleeve(p, slot="first not running", image="docker image")
    p.add_argument("--shell", action="store_true", help="run the `shell` CLI instead")
    p.add_argument(
        "--runtime",
        choices=list(runtimes.RUNTIMES),
        help="default: docker when an engine answers, else bwrap",
    )
    p.add_argument("--port", type=int, help="API port on 127.0.0.1 (default: a free one)")
    p.add_argument(
        "--network",
        choices=["bridge", "host"],
        default="bridge",
        help="docker network (default bridge, API published on 127.0.0.1)",
    )
    p.add_argument("--wait", type=float, default=30.0, help="seconds to wait for /health")
    p.add_argument("--cpus", type=float, help="CPU limit, e.g. 1.5 (bwrap: needs systemd)")
    p.add_argument("--memory", help="memory limit, e.g. 512m or 2g (bwrap: needs systemd)")
    p.add_argument("--pids-limit", type=int, help="most processes at once (bwrap: needs systemd)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the exact argv (stdout) and a mount/env audit (stderr)",
    )


def _add_manifest(subs: _Subcommands) -> None:
    p = subs.add("manifest", cmd_manifest, "print one slot's sleeve as Kubernetes YAML")
    _add_sleeve(p, slot="the first one", image="image")
    p.add_argument("--name", help="StatefulSet and Service name (default sleeve-<project>-<id>)")
    p.add_argument("--namespace", default="default", help="namespace (default %(default)s)")
    p.add_argument(
        "--token-secret",
        metavar="SECRET",
        help="an existing Secret with keys token and view-token (default: one is rendered, "
        "its tokens kept in $SLEEVE_HOME/kube/)",
    )
    # What `sleeve run` asks about the host and the cluster has no use for.
    p.set_defaults(shell=False, port=None, network="bridge", cpus=None, memory=None)
    p.set_defaults(pids_limit=None)


def _add_listings(subs: _Subcommands) -> None:
    text = "recorded runs, reconciled with reality"
    subs.add("ps", cmd_ps, text, listing=True, project_default=None)
    subs.add("instances", cmd_instances, "per-project history dirs", listing=True)
    p = subs.add("gc", cmd_gc, "remove instances whose project root is gone")
    p.add_argument("--dry-run", action="store_true", help="only print what would go")


def _add_answers(subs: _Subcommands) -> None:
    sleeve = "the sleeve: its run id as `sleeve ps` shows it, or its slot number in --project"
    request = "the request's id (`sleeve ps` lists them)"
    p = subs.add("approve", cmd_approve, "allow one permission request of a running sleeve")
    p.add_argument("name", metavar="NAME", help=sleeve)
    p.add_argument("id", metavar="ID", help=request)
    p.add_argument(
        "--remember", action="store_true", help="allow this kind of call for the session"
    )
    p = subs.add("deny", cmd_deny, "deny one permission request of a running sleeve")
    p.add_argument("name", metavar="NAME", help=sleeve)
    p.add_argument("id", metavar="ID", help=request)
    p.add_argument("--message", metavar="TEXT", help="told to the agent")


def _add_build(subs: _Subcommands) -> None:
    p = subs.add("build", cmd_build, "build image/Dockerfile unless its inputs are unchanged")
    p.add_argument("--image", default="sleeve:latest", help="tag (default %(default)s)")
    p.add_argument("--context", metavar="DIR", help="build context (default: the repo root)")
    p.add_argument("--file", metavar="DOCKERFILE", help="default: CONTEXT/image/Dockerfile")
    p.add_argument("--build-arg", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--clis",
        metavar="NAMES",
        help="the AI CLIs in the image, comma-separated (the CLIS build arg; default "
        "claude-code): claude-code and the folders of CONTEXT/image/clis/",
    )
    p.add_argument("--force", action="store_true", help="build even if up to date")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sleeve",
        description="Host launcher for sleeves: slots, instances, runs (docker or bwrap).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subs = _Subcommands(parser)
    # In this order in `sleeve --help`.
    _add_slot_commands(subs)
    _add_run(subs)
    _add_manifest(subs)
    _add_listings(subs)
    _add_answers(subs)
    _add_build(subs)
    return parser


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        # Lifecycle lines (INFO) repeat what the commands print; -v shows them and the mechanics.
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="sleeve: %(message)s",
        stream=sys.stderr,
    )
    settings = Settings.from_env(os.environ if env is None else env)
    try:
        result: int = args.func(args, settings)
    except LauncherError as exc:
        print(f"sleeve: {exc}", file=sys.stderr)
        return 1
    return result
