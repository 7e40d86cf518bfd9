"""The `sleeve` subcommands that make, run and stop sleeves (create, slots, rm, stop, run,
manifest), one small function each, given its parsed arguments and the environment read once
(`Settings`). The listings are `sidecar.launcher.listings`'s, the image build
`sidecar.launcher.build`'s.

Stopping is `sleeve stop N` (SIGTERM via the bwrap waiter, or `docker stop`; the run becomes
`stopped`); `sleeve rm N --force` stops a running slot before removing it. A problem the user
can act on is a LauncherError (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.core.loopback import free_port
from sidecar.launcher import engine, instances, launch, runopts, runtimes
from sidecar.launcher.fsutil import LauncherError, locked, private_home
from sidecar.launcher.plan import RunPlan, audit, home_mounts, passthrough_env
from sidecar.launcher.slots import Project, Slot, SlotState, prepare_home_files
from sidecar.launcher.state import Run, StateStore, running_slots
from sidecar.security.tokens import TOKEN_VAR

if TYPE_CHECKING:
    from sidecar.launcher.secretopts import SecretArg

# A module only some subcommands need (the allowlists, Kubernetes and YAML) is imported where
# it is used: every `sleeve` command pays for what it imports at start, and `sleeve slots` is
# meant to answer within 100 ms (scripts/bench launcher.slots).

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


def project_of(args: argparse.Namespace, settings: Settings, *, read_only: bool = False) -> Project:
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


def print_json(data: object) -> None:
    print(json.dumps(data, indent=2, default=str))


# -- slots -----------------------------------------------------------------------------


def cmd_create(args: argparse.Namespace, settings: Settings) -> int:
    project = project_of(args, settings)
    private_home(settings.home)
    instances.ensure_instance(settings.home, project.root)
    slot = project.create()
    if args.json:
        print_json({"index": slot.index, "id": slot.id, "folder": str(slot.path)})
    else:
        print(f"created slot {slot.index} ({slot.id}) in {slot.path}")
    return 0


def cmd_slots(args: argparse.Namespace, settings: Settings) -> int:
    project = project_of(args, settings)
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
        print_json({"project": str(project.root), "dir": str(project.dir), "slots": rows})
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
    project = project_of(args, settings)
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
    project = project_of(args, settings)
    run = _active_run(settings, project, args.slot)
    if run is None:
        msg = f"slot {args.slot} is not running"
        raise LauncherError(msg)
    launch.stop(settings.home, run, grace=args.grace)
    print(f"stopped slot {args.slot} ({run.runtime})")
    return 0


# -- run -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Network:
    """`--egress`'s patterns (None: open) and the `--secret`s, values read: checked once, before
    anything starts."""

    egress: tuple[str, ...] | None
    secrets: tuple[SecretArg, ...] = ()

    @classmethod
    def of(cls, args: argparse.Namespace, settings: Settings) -> _Network:
        from sidecar.launcher import egress_lists, secretopts

        cli = "shell" if args.shell else args.cli
        egress = egress_lists.choose(args.egress, cli, passthrough_env(settings.env))
        if args.egress == egress_lists.DEFAULT and egress is not None:
            egress = secretopts.with_hosts(egress, args.secret)  # a secret's API is meant
        return cls(egress, secretopts.parse_all(args.secret, egress))


def _plan(
    args: argparse.Namespace, settings: Settings, project: Project, slot: Slot, net: _Network
) -> RunPlan:
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
        port=launch.check_port(args.port) if args.port else free_port(),
        image=args.image,
        network_host=args.network == "host",
        passthrough=passthrough_env(settings.env, net.secrets),
        egress=net.egress,
        secrets=net.secrets,
    )


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from sidecar.launcher import kube, manifest, projectfiles

    try:  # before anything starts: a typo is not a sleeve that fails later
        manifest.check_cli("shell" if args.shell else args.cli, settings.env, unread_passes=True)
    except kube.ManifestError as exc:
        print(f"sleeve: {exc}", file=sys.stderr)
        return 2
    project = project_of(args, settings, read_only=args.dry_run)  # --dry-run writes nothing
    runtime = runtimes.choose(args.runtime, dry_run=args.dry_run)
    limits = runopts.limits(args.cpus, args.memory, args.pids_limit)
    runtime.check_limits(limits)
    sleeve_tokens = runopts.sleeve_tokens(settings.env)
    net = _Network.of(args, settings)
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
        run_id = launch.new_run_id()
        plan = dataclasses.replace(
            _plan(args, settings, project, slot, net),
            user=runtime.user(),
            limits=limits,
            tokens=sleeve_tokens,
            sleeve_name=run_id,  # the dashboard names the run as `sleeve ps` does
        )
        run = Run(run_id, project.key, slot.index, slot.id, runtime.name, plan.cli)
        run.port = plan.port
        run.token = sleeve_tokens[TOKEN_VAR]  # for the owner: `sleeve ps --json`
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
    launch.await_cli(home, run)
    note = projectfiles.note_once(instances.instance_dir(home, project.root), plan.workspace)
    if note is not None:
        print(f"sleeve: {note}", file=sys.stderr)
    # Printed once; `sleeve ps --json` has the token again.
    print(
        f"slot {slot.index} ({slot.id}) runs {plan.cli} under {runtime.name}: "
        f"{url}?token={run.token}"
    )
    return 0


# -- manifest --------------------------------------------------------------------------


def cmd_manifest(args: argparse.Namespace, settings: Settings) -> int:
    """The cluster form of `sleeve run`: one slot's sleeve as Kubernetes YAML on stdout."""
    from sidecar.launcher import egress_lists, kube, manifest, secretopts

    try:
        project = project_of(args, settings, read_only=True)
        slot = manifest.pick_slot(project, args.slot)
        manifest.check_cli(args.cli, settings.env)
        manifest.check_image(args.image)
        name = manifest.check_name(args.name) if args.name else None
        namespace = manifest.check_namespace(args.namespace)
        # Each --secret file is read as `sleeve run` reads it (its problems said now); no value
        # is ever rendered.
        plan = _plan(args, settings, project, slot, _Network.of(args, settings))
        kube.stop_grace(plan.passthrough)
    except (kube.ManifestError, egress_lists.EgressChoiceError, secretopts.SecretError) as exc:
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
