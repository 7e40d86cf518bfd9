"""The inputs of `sleeve manifest`: names, namespace, image, CLI and slot checked (bad input is
a `ManifestError`, exit 2), the cluster sleeve's tokens kept under `$SLEEVE_HOME/kube/`, and
the hints printed beside the YAML. The objects themselves are built by `kube`.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from sidecar.launcher.fsutil import LauncherError, atomic_write, private_dir
from sidecar.launcher.homes import seeded
from sidecar.launcher.kube import ManifestError, Target, Tokens
from sidecar.launcher.plan import PASSTHROUGH, RunPlan
from sidecar.launcher.slots import Project, Slot, SlotState

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# StatefulSet pods carry `controller-revision-hash: <name>-<10 chars>`, a label value (<= 63).
NAME_MAX = 52
# The distribution reference grammar: [domain[:port]/]path[:tag][@algorithm:hex], no spaces.
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*(?::[0-9]+)?/)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"(?::\w[\w.-]{0,127})?"
_DIGEST = r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
IMAGE_REF = re.compile(rf"^{_DOMAIN}{_COMPONENT}(?:/{_COMPONENT})*{_TAG}{_DIGEST}$")


def check_name(name: str) -> str:
    # The Service takes this name too, and a Service name must start with a letter.
    if len(name) > NAME_MAX or not DNS_LABEL.match(name) or not name[0].isalpha():
        msg = (
            f"--name {name!r} is not a usable name: a DNS-1123 label (a-z, 0-9 and '-', starting "
            f"with a letter, ending with a letter or digit) of at most {NAME_MAX} characters"
        )
        raise ManifestError(msg)
    return name


def check_namespace(namespace: str) -> str:
    if len(namespace) > 63 or not DNS_LABEL.match(namespace):
        msg = (
            f"--namespace {namespace!r} is not a DNS-1123 label (a-z, 0-9 and '-', starting and "
            "ending with a letter or digit, at most 63 characters)"
        )
        raise ManifestError(msg)
    return namespace


def check_image(image: str) -> str:
    if not IMAGE_REF.match(image):
        msg = (
            f"--image {image!r} is not an image reference "
            "(like sleeve:latest, registry.example:5000/team/sleeve:1.2 or name@sha256:<hex>)"
        )
        raise ManifestError(msg)
    return image


def check_cli(name: str, env: Mapping[str, str], *, unread_passes: bool = False) -> str:
    """The built-in CLIs, plus those of a SIDECAR_CLI_CONFIG readable here (it may exist only
    in the image; then the sidecar in the pod is the judge of it). `unread_passes`: with such a
    file not readable here, any name passes (`sleeve run` reports the sleeve's verdict)."""
    from sidecar.agent.registry import load_registry
    from sidecar.config import ConfigError

    config = env.get("SIDECAR_CLI_CONFIG")
    try:
        known = load_registry(Path(config) if config else None)
    except ConfigError:
        if unread_passes:
            return name
        known = load_registry(None)
    if name not in known:
        msg = f"--cli {name!r} is not a known CLI (known: {', '.join(sorted(known))})"
        raise ManifestError(msg)
    return name


def pick_slot(project: Project, wanted: int | None) -> Slot:
    """`--slot N` if it exists; else the first live slot, or slot 1 as `sleeve create` would
    make it (its id is known before its folder exists, as in `sleeve run --dry-run`)."""
    if wanted is None:
        alive = [s for s in project.slots(prune=False) if s.state is not SlotState.DEAD]
        if alive:
            return alive[0]
        return project.unmade_slot(1)
    try:
        slot = project.get(wanted)
    except LauncherError as exc:
        raise ManifestError(str(exc)) from None
    if slot.state is SlotState.DEAD:
        msg = f"slot {wanted} does not exist (its directory is gone); `sleeve create` makes one"
        raise ManifestError(msg)
    return slot


def default_name(project_name: str, slot_id: str) -> str:
    """`sleeve-<project>-<slot id>`, the project part cut so that the whole fits NAME_MAX."""
    base = re.sub(r"[^a-z0-9]+", "-", project_name.lower()).strip("-")
    base = base[: NAME_MAX - len("sleeve--") - len(slot_id)].strip("-")
    return f"sleeve-{base}-{slot_id}" if base else f"sleeve-{slot_id}"


def stored_tokens(home: Path, namespace: str, name: str) -> Tokens:
    """This cluster sleeve's tokens, made once and kept 0600 under `$SLEEVE_HOME/kube/`, so
    that a second `sleeve manifest | kubectl apply -f -` keeps the tokens the pod has read."""
    path = home / "kube" / f"{namespace}_{name}.json"  # '_' is in no DNS label: unambiguous
    try:
        data = json.loads(path.read_text())
        return Tokens(str(data["token"]), str(data["view_token"]))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as exc:
        msg = f"cannot read the stored tokens in {path} ({exc}); remove it to make new ones"
        raise LauncherError(msg) from exc
    tokens = Tokens.new()
    private_dir(path.parent)
    atomic_write(path, json.dumps({"token": tokens.token, "view_token": tokens.view_token}))
    return tokens


def hints(target: Target, slot: Slot, plan: RunPlan) -> list[str]:
    """What the YAML leaves to the user: the Secrets it refers to but must not hold."""
    ns, name = target.namespace, target.name
    lines = []
    keys = [k for k in PASSTHROUGH if k in plan.passthrough and k.endswith(("_KEY", "_TOKEN"))]
    if keys:
        literals = " ".join(f'--from-literal={k}="${k}"' for k in keys)
        lines.append(
            f"API keys come from Secret {name}-api-keys, never from this output: "
            f"kubectl -n {ns} create secret generic {name}-api-keys {literals}"
        )
    if plan.secrets:
        files = " ".join(f"--from-file={s.name}={shlex.quote(s.path)}" for s in plan.secrets)
        lines.append(
            f"--secret values come from Secret {name}-secrets, never from this output: "
            f"kubectl -n {ns} create secret generic {name}-secrets {files}"
        )
    seed = seeded()
    sign_in = str(seed.sign_in)
    if slot.state is SlotState.AUTHENTICATED and (slot.path / sign_in).exists():
        creds = shlex.quote(str(slot.path / sign_in))
        lines.append(
            f"slot {slot.index} is logged in; to seed the pod with that login once: "
            f"kubectl -n {ns} create secret generic {name}-{seed.seed} "
            f"--from-file={PurePosixPath(sign_in).name}={creds}"
        )
    return lines
