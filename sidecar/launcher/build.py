"""`sleeve build`: the sleeve image, built only when its inputs changed (`engine` decides), with
the CLIs `--clis` names checked before any build starts.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import shlex
import subprocess
from pathlib import Path

from sidecar.launcher import engine
from sidecar.launcher.commands import Settings
from sidecar.launcher.fsutil import LauncherError

logger = logging.getLogger(__name__)


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
