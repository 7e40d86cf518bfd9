"""`sleeve`: the host launcher's command line; one small function per subcommand.

Stopping is `sleeve stop N` (SIGTERM via the bwrap waiter, or `docker stop`; the run becomes
`stopped`); `sleeve rm N --force` stops a running slot before removing it. Exit 1 = refused.
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sidecar.launcher import engine, instances, kube, launch, manifest, runopts, runtimes
from sidecar.launcher.fsutil import LauncherError, locked, private_home
from sidecar.launcher.plan import RunPlan, audit, home_mounts, passthrough_env
from sidecar.launcher.slots import Project, Slot, SlotState, prepare_home_files
from sidecar.launcher.state import Run, StateStore, running_slots

logger = logging.getLogger(__name__)

ICONS = {SlotState.AUTHENTICATED: "✔️ ", SlotState.UNAUTHENTICATED: "🔒", SlotState.DEAD: "💀"}


EPILOG = """\
state lives in $SLEEVE_HOME (default ~/.sleeve).
stopping: `sleeve stop N` sends SIGTERM (bwrap: through the waiter to the sandbox's PID 1;
docker: `docker stop`) and waits; `sleeve rm N --force` stops a running slot, then removes it.
run statuses in `sleeve ps`: starting, running, completed (exit 0), failed (code N),
failed (vanished) (gone without an exit code), stopped (ended by `sleeve stop`).
"""


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
    return RunPlan(
        name=project.container_name(slot.id),
        project_key=project.key,
        home_label=engine.home_label(settings.home),
        slot_index=slot.index,
        slot_id=slot.id,
        workspace=instances.project_path(args.project),
        slot_dir=slot.path,
        instance_dir=instances.instance_dir(settings.home, project.root),
        cli="shell" if args.shell else args.cli,
        goal=args.goal,
        port=launch.check_port(args.port) if args.port else launch.free_port(),
        image=args.image,
        network_host=args.network == "host",
        passthrough=passthrough_env(settings.env),
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
        command = runtime.command(run, plan, home, settings.env)
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
    try:
        project = _project(args, settings, read_only=True)
        slot = manifest.pick_slot(project, args.slot)
        manifest.check_cli(args.cli, settings.env)
        manifest.check_image(args.image)
        name = manifest.check_name(args.name) if args.name else None
        namespace = manifest.check_namespace(args.namespace)
        plan = _plan(args, settings, project, slot)
        kube.stop_grace(plan.passthrough)
    except kube.ManifestError as exc:
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
    runs = launch.observe(
        settings.home, docker=shutil.which("docker") is not None, adopt_bwrap=True
    )
    if args.project is not None:
        key = _project(args, settings).key
        runs = [r for r in runs if r.project == key]
    if args.json:
        _print_json([dataclasses.asdict(r) for r in runs])
        return 0
    if not runs:
        print("no sleeves recorded")
        return 0
    row = "{:24}  {:>4}  {:7}  {:18}  {:>5}  {:>8}  {}"
    print(row.format("run", "slot", "runtime", "status", "port", "started", "project"))
    for r in runs:
        started = instances.age(r.started_at)
        print(row.format(r.id, r.slot, r.runtime, r.status, r.port or "", started, r.project))
    return 0


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


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        msg = f"--build-arg wants KEY=VALUE, got {text!r}"
        raise LauncherError(msg)
    return key, value


# -- wiring ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sleeve",
        description="Host launcher for sleeves: slots, instances, runs (docker or bwrap).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(
        name: str,
        func: Callable[[argparse.Namespace, Settings], int],
        text: str,
        *,
        listing: bool = False,
        project_default: str | None = ".",
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, description=text)
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

    add("create", cmd_create, "create a slot (reuses the first dead one)", listing=True)
    add("slots", cmd_slots, "prune the counter, then list the project's slots", listing=True)
    p = add("rm", cmd_rm, "remove slot N's directory")
    p.add_argument("slot", type=int, metavar="N")
    p.add_argument("--force", action="store_true", help="stop it first if it is running")
    p = add("stop", cmd_stop, "stop the sleeve running in slot N")
    p.add_argument("slot", type=int, metavar="N")
    p.add_argument("--grace", type=float, default=15.0, help="seconds before SIGKILL (bwrap)")
    p = add("run", cmd_run, "start a sleeve in the first free slot")
    p.add_argument("--slot", type=int, metavar="N", help="this slot (default: first not running)")
    p.add_argument("--cli", default="claude-code", help="CLI to run (default claude-code)")
    p.add_argument("--shell", action="store_true", help="run the `shell` CLI instead")
    p.add_argument("--goal", metavar="TEXT", help="task for the sleeve (SLEEVE_GOAL)")
    p.add_argument(
        "--runtime",
        choices=list(runtimes.RUNTIMES),
        help="default: docker when an engine answers, else bwrap",
    )
    p.add_argument("--image", default="sleeve:latest", help="docker image (default %(default)s)")
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
    p = add("manifest", cmd_manifest, "print one slot's sleeve as Kubernetes YAML")
    p.add_argument("--slot", type=int, metavar="N", help="this slot (default: the first one)")
    p.add_argument("--cli", default="claude-code", help="CLI to run (default claude-code)")
    p.add_argument("--goal", metavar="TEXT", help="task for the sleeve (SLEEVE_GOAL)")
    p.add_argument("--image", default="sleeve:latest", help="image (default %(default)s)")
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
    add("ps", cmd_ps, "recorded runs, reconciled with reality", listing=True, project_default=None)
    add("instances", cmd_instances, "per-project history dirs", listing=True)
    p = add("gc", cmd_gc, "remove instances whose project root is gone")
    p.add_argument("--dry-run", action="store_true", help="only print what would go")
    p = add("build", cmd_build, "build image/Dockerfile unless its inputs are unchanged")
    p.add_argument("--image", default="sleeve:latest", help="tag (default %(default)s)")
    p.add_argument("--context", metavar="DIR", help="build context (default: the repo root)")
    p.add_argument("--file", metavar="DOCKERFILE", help="default: CONTEXT/image/Dockerfile")
    p.add_argument("--build-arg", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--force", action="store_true", help="build even if up to date")
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
