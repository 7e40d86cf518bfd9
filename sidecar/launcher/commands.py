"""One small function per `sleeve` subcommand, given its parsed arguments and the environment.

Stopping is `sleeve stop N` (SIGTERM via the bwrap waiter, or `docker stop`; the run becomes
`stopped`); `sleeve rm N --force` stops a running slot before removing it. A problem the user
can act on is a LauncherError (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.launcher import engine, instances, launch, runopts, runtimes
from sidecar.launcher.fsutil import LauncherError, locked, private_home
from sidecar.launcher.plan import RunPlan, audit, home_mounts, passthrough_env
from sidecar.launcher.slots import Project, Slot, SlotState, prepare_home_files
from sidecar.launcher.state import Run, StateStore, running_slots

# A module only some subcommands need (the allowlists, Kubernetes and YAML, the HTTP client of
# `ps`) is imported where it is used: every `sleeve` command pays for what it imports at start,
# and `sleeve slots` is meant to answer within 100 ms (scripts/bench launcher.slots).
if TYPE_CHECKING:
    from sidecar.launcher.agents import Agent

logger = logging.getLogger(__name__)

ICONS = {SlotState.AUTHENTICATED: "✔️ ", SlotState.UNAUTHENTICATED: "🔒", SlotState.DEAD: "💀"}


@dataclass(frozen=True)
class Settings:
    """The environment, read once."""

    home: Path
    env: Mapping[str, str]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        home = Path(env.get("SLEEVE_HOME") or "~/.sleeve").expanduser()
        return cls(Path(os.path.abspath(home)), dict(env))


def _project(args: argparse.Namespace, settings: Settings, *, read_only: bool = False) -> Project:
    path = instances.project_path(args.project)
    return Project(instances.canonical_root(path), settings.home, read_only)


def _observe(
    settings: Settings, *, docker: bool = False, read_only: bool = False, adopt: bool = False
) -> list[Run]:
    """Reconciled runs; docker is asked (once) only when it was asked for or could know.
    `adopt`: also bwrap sleeves nobody recorded (state.json lost): what a command that starts
    or removes something must not overlook."""
    docker = docker or launch.docker_in_use(settings.home, settings.env)
    return launch.observe(settings.home, docker=docker, read_only=read_only, adopt_bwrap=adopt)


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2, default=str))


# -- slots -----------------------------------------------------------------------------


def cmd_create(args: argparse.Namespace, settings: Settings) -> int:
    project = _project(args, settings)
    private_home(settings.home)
    instances.ensure_instance(settings.home, project.root)
    slot = project.create()
    if args.json:
        _print_json({"index": slot.index, "id": slot.id, "folder": str(slot.path)})
    else:
        print(f"created slot {slot.index} ({slot.id}) in {slot.path}")
    return 0


def cmd_slots(args: argparse.Namespace, settings: Settings) -> int:
    project = _project(args, settings)
    slots = project.slots(prune=True)
    runs = _observe(settings) if slots else []
    busy = running_slots(runs, project.key)
    rows = [
        {
            "index": s.index,
            "id": s.id,
            "state": s.state.value,
            "running": s.index in busy,
            "runtime": busy[s.index].runtime if s.index in busy else None,
            "port": busy[s.index].port if s.index in busy else None,
            "folder": str(s.path),
        }
        for s in slots
    ]
    if args.json:
        _print_json({"project": str(project.root), "dir": str(project.dir), "slots": rows})
        return 0
    if not slots:
        print(f"no slots for {project.root} yet; `sleeve create` adds one")
        return 0
    print(f"slots for {project.root}:")
    print(f"  {'slot':>4}  {'id':8}  {'state':18}  {'running':16}  folder")
    for s, row in zip(slots, rows, strict=True):
        running = f"● {row['runtime']} :{row['port']}" if row["running"] else ""
        state = f"{ICONS[s.state]} {s.state.value}"
        print(f"  {s.index:>4}  {s.id:8}  {state:18}  {running:16}  {s.path}")
    return 0


def _active_run(settings: Settings, project: Project, index: int) -> Run | None:
    runs = _observe(settings, adopt=True)
    return running_slots(runs, project.key).get(index)


def cmd_rm(args: argparse.Namespace, settings: Settings) -> int:
    project = _project(args, settings)
    project.get(args.slot)  # an unknown index fails before anything is stopped
    # The run lock: a `sleeve run` cannot pick this slot between the check and the removal.
    with locked(settings.home / "run.lock"):
        run = _active_run(settings, project, args.slot)
        if run is not None:
            if not args.force:
                msg = (
                    f"slot {args.slot} is running ({run.runtime}); "
                    f"`sleeve stop {args.slot}` first, or `sleeve rm {args.slot} --force`"
                )
                raise LauncherError(msg)
            launch.stop(settings.home, run)
        slot = project.remove(args.slot)
    print(f"removed slot {slot.index} ({slot.id})")
    return 0


def cmd_stop(args: argparse.Namespace, settings: Settings) -> int:
    project = _project(args, settings)
    run = _active_run(settings, project, args.slot)
    if run is None:
        msg = f"slot {args.slot} is not running"
        raise LauncherError(msg)
    launch.stop(settings.home, run, grace=args.grace)
    print(f"stopped slot {args.slot} ({run.runtime})")
    return 0


# -- run -------------------------------------------------------------------------------


def _plan(args: argparse.Namespace, settings: Settings, project: Project, slot: Slot) -> RunPlan:
    from sidecar.launcher import egress_lists

    cli = "shell" if args.shell else args.cli
    return RunPlan(
        name=project.container_name(slot.id),
        project_key=project.key,
        home_label=engine.home_label(settings.home),
        slot_index=slot.index,
        slot_id=slot.id,
        workspace=instances.project_path(args.project),
        slot_dir=slot.path,
        instance_dir=instances.instance_dir(settings.home, project.root),
        cli=cli,
        goal=args.goal,
        port=launch.check_port(args.port) if args.port else launch.free_port(),
        image=args.image,
        network_host=args.network == "host",
        passthrough=passthrough_env(settings.env),
        egress=egress_lists.choose(args.egress, cli, passthrough_env(settings.env)),
    )


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    project = _project(args, settings, read_only=args.dry_run)  # --dry-run writes nothing
    runtime = runtimes.choose(args.runtime, dry_run=args.dry_run)
    limits = runopts.limits(args.cpus, args.memory, args.pids_limit)
    runtime.check_limits(limits)
    sleeve_tokens = runopts.sleeve_tokens(settings.env)
    home = settings.home
    if not args.dry_run:
        private_home(home)
        project.ensure()
        instances.ensure_instance(home, project.root)
    # One global lock from slot choice to the record: two runs never pick the same slot.
    lock = contextlib.nullcontext() if args.dry_run else locked(home / "run.lock")
    with lock:
        runs = _observe(
            settings, docker=runtime.uses_containers, read_only=args.dry_run, adopt=True
        )
        slot = launch.pick_slot(project, runs, args.slot, create=not args.dry_run)
        if not args.dry_run:
            prepare_home_files(slot)
        plan = dataclasses.replace(
            _plan(args, settings, project, slot),
            user=runtime.user(),
            limits=limits,
            tokens=sleeve_tokens,
        )
        run = Run(launch.new_run_id(), project.key, slot.index, slot.id, runtime.name, plan.cli)
        run.port = plan.port
        run.token = sleeve_tokens["SIDECAR_TOKEN"]  # for the owner: `sleeve ps --json`
        run.stop_timeout = plan.stop_timeout  # what `sleeve stop` gives it
        command = runtime.command(run, plan, home, settings.env)
        if plan.egress is None:
            print(
                "sleeve: --egress open: the agent's network is open (no allowlist)", file=sys.stderr
            )
        if args.dry_run:
            for step in command.steps:
                print(shlex.join(step))  # the very lists the real run executes
            print(audit(home_mounts(plan), command.env_names), file=sys.stderr)
            return 0
        runtime.start(run, plan, command)
        StateStore(home).upsert(run)
    url = launch.await_health(home, run, args.wait)
    # Printed once; `sleeve ps --json` has the token again.
    print(
        f"slot {slot.index} ({slot.id}) runs {plan.cli} under {runtime.name}: "
        f"{url}?token={run.token}"
    )
    return 0


# -- manifest --------------------------------------------------------------------------


def cmd_manifest(args: argparse.Namespace, settings: Settings) -> int:
    """The cluster form of `sleeve run`: one slot's sleeve as Kubernetes YAML on stdout."""
    from sidecar.launcher import egress_lists, kube, manifest

    try:
        project = _project(args, settings, read_only=True)
        slot = manifest.pick_slot(project, args.slot)
        manifest.check_cli(args.cli, settings.env)
        manifest.check_image(args.image)
        name = manifest.check_name(args.name) if args.name else None
        namespace = manifest.check_namespace(args.namespace)
        plan = _plan(args, settings, project, slot)
        kube.stop_grace(plan.passthrough)
    except (kube.ManifestError, egress_lists.EgressChoiceError) as exc:
        print(f"sleeve: {exc}", file=sys.stderr)
        return 2
    name = name or manifest.default_name(project.root.name, slot.id)
    tokens = None
    if args.token_secret is None:
        tokens = manifest.stored_tokens(settings.home, namespace, name)
    target = kube.Target(name, namespace, tokens, args.token_secret)
    sys.stdout.write(kube.render(kube.objects(plan, target)))
    for line in manifest.hints(target, slot, plan):  # on stderr: stdout stays pure YAML
        print(f"sleeve: {line}", file=sys.stderr)
    return 0


# -- listings --------------------------------------------------------------------------


def cmd_ps(args: argparse.Namespace, settings: Settings) -> int:
    from sidecar.launcher import agents

    runs = launch.observe(
        settings.home, docker=shutil.which("docker") is not None, adopt_bwrap=True
    )
    if args.project is not None:
        key = _project(args, settings).key
        runs = [r for r in runs if r.project == key]
    found = agents.agents(runs)  # running sleeves only; bounded by agents.DEADLINE
    if args.json:
        _print_json([_ps_record(r, found.get(r.id)) for r in runs])
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
        _print_json(
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
    for root in instances.gc(settings.home, dry_run=args.dry_run):
        print(f"{verb} {root}", file=sys.stderr)
    return 0


# -- build -----------------------------------------------------------------------------


def _repo_root() -> Path:
    import sidecar

    return Path(sidecar.__file__).resolve().parent.parent


def cmd_build(args: argparse.Namespace, settings: Settings) -> int:
    context = Path(args.context).resolve() if args.context else _repo_root()
    dockerfile = Path(args.file).resolve() if args.file else context / "image" / "Dockerfile"
    if not dockerfile.is_file():
        msg = f"no Dockerfile at {dockerfile} (use --context or --file)"
        raise LauncherError(msg)
    build_args = dict(_key_value(a) for a in args.build_arg)
    if args.clis is not None:
        if "CLIS" in build_args:
            msg = "--clis and --build-arg CLIS=... both name the image's CLIs: give one"
            raise LauncherError(msg)
        build_args["CLIS"] = _clis_arg(args.clis, context)
    checksum = engine.inputs_checksum(context, dockerfile, build_args)
    engine.require_engine()
    existing = engine.image_checksum(args.image)
    if not engine.needs_build(checksum, existing, force=args.force):
        print(f"{args.image} is up to date (inputs {checksum[:12]}); --force rebuilds")
        return 0
    argv = engine.build_argv(args.image, context, dockerfile, checksum, build_args)
    # Build args may hold secrets: the log line names them and leaves their values out.
    shown = argv[:1] + [
        a.partition("=")[0] if b == "--build-arg" else a for b, a in itertools.pairwise(argv)
    ]
    logger.info("building %s: %s", args.image, shlex.join(shown))
    return subprocess.run(argv, check=False).returncode


def _clis_arg(names: str, context: Path) -> str:
    """`--clis a,b` as the Dockerfile's CLIS value, each name checked before any build starts:
    Claude Code is built in, every other CLI is a folder of image/clis/ holding its lock."""
    wanted = list(dict.fromkeys(names.replace(",", " ").split()))
    locked = (context / "image" / "clis").glob("*/package-lock.json")
    known = ["claude-code", *sorted(p.parent.name for p in locked)]
    unknown = [n for n in wanted if n not in known]
    if unknown:
        msg = f"--clis: no CLI {', '.join(unknown)} to install (known: {', '.join(known)})"
        raise LauncherError(msg)
    return " ".join(wanted)


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        msg = f"--build-arg wants KEY=VALUE, got {text!r}"
        raise LauncherError(msg)
    return key, value
