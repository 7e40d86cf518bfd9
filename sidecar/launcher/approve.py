"""`sleeve approve NAME ID` and `sleeve deny NAME ID`: answer one permission request of a running
sleeve through that sleeve's own API, with the token recorded for it. NAME is the run id `sleeve
ps` shows, or a slot number of the project; ID is the request's id (`sleeve ps` lists them).
"""

from __future__ import annotations

import argparse

from sidecar.launcher import instances, launch
from sidecar.launcher.commands import Settings
from sidecar.launcher.fsutil import LauncherError
from sidecar.launcher.slots import Project
from sidecar.launcher.state import Run, running_slots


def _sleeve(args: argparse.Namespace, settings: Settings) -> Run:
    """The running sleeve NAME names: a run id, else (all digits) slot NAME of --project."""
    docker = launch.docker_in_use(settings.home, settings.env)
    runs = [r for r in launch.observe(settings.home, docker=docker) if r.active]
    run = next((r for r in runs if r.id == args.name), None)
    if run is None and args.name.isdigit():
        path = instances.project_path(args.project)
        project = Project(instances.canonical_root(path), settings.home, read_only=True)
        run = running_slots(runs, project.key).get(int(args.name))
    if run is None:
        msg = f"no running sleeve {args.name!r} (a run id from `sleeve ps`, or a slot number)"
        raise LauncherError(msg)
    if run.port is None:
        msg = f"sleeve {run.id} has no API port recorded"
        raise LauncherError(msg)
    return run


def _answer(args: argparse.Namespace, settings: Settings, decision: str) -> int:
    # Imported here: the other `sleeve` commands do not pay for the HTTP client's imports.
    from sidecar.client import ClientError, SidecarClient

    run = _sleeve(args, settings)
    client = SidecarClient(f"http://127.0.0.1:{run.port}", run.token)
    try:
        if decision == "allow":
            client.approve(args.id, remember=args.remember)
        else:
            client.deny(args.id, message=args.message)
    except ClientError as exc:
        why = " (no token recorded for it)" if exc.status == 401 and not run.token else ""
        msg = f"sleeve {run.id}: {exc}{why}"
        raise LauncherError(msg) from None
    print(f"{'allowed' if decision == 'allow' else 'denied'} {args.id} in sleeve {run.id}")
    return 0


def cmd_approve(args: argparse.Namespace, settings: Settings) -> int:
    return _answer(args, settings, "allow")


def cmd_deny(args: argparse.Namespace, settings: Settings) -> int:
    return _answer(args, settings, "deny")
