"""Entry point wiring: `sidecar run` validates the configuration, becomes the init process and
runs the supervisor plus the HTTP API in its child; other subcommands are API clients."""

from __future__ import annotations

import errno
import logging
import os
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from sidecar.agent.registry import CLIDef
    from sidecar.config import Config
    from sidecar.process.init import Incarnation

# The init process (PID 1) stays small: asyncio, aiohttp and the rest are imported in its child
# only. Whatever init has imported before the fork is a copy the supervisor does not need.

SHUTDOWN_TIMEOUT = 2.0  # seconds the API waits for requests still running at shutdown
log = logging.getLogger("sidecar")
SECRETS = "SIDECAR_SECRETS_FILE"


def _load(env: dict[str, str]) -> tuple[Config, dict[str, CLIDef], int]:
    """The configuration, the registry, and the state dir's lock (a descriptor to keep open)."""
    from sidecar.agent.registry import load_registry, packages
    from sidecar.config import Config, trusted
    from sidecar.process import statedir, statelock
    from sidecar.security.acting import Owner

    config = Config.from_env(env)
    owner = None
    if config.user is not None:
        _take_user_group(config)
        owner = Owner(config.user.uid, config.user.gid, act_as=True)
    shell = env.get("SHELL") or "/bin/bash"
    extra = packages(config.cli_packages, config.workspace)  # as the sidecar: its own modules
    login_shell = shell if os.path.isabs(shell) else "/bin/bash"
    registry = load_registry(config.cli_config, login_shell, extra, reader=owner)
    statedir.prepare(config)
    # Before anything in the state dir is used: a second sidecar there would kill this one's
    # tmux server, and this one its.
    lock = statelock.take(config.paths.lock, config.port)
    if config.audit_dir is not None:
        _prepare_audit_dir(config.audit_dir)
    trusted.check(config)
    if config.egress is not None:
        _check_egress(config)
    return config, dict(registry), lock


def _check_egress(config: Config) -> None:
    """SIDECAR_EGRESS_ALLOW: never start with the list set and the network open. A guarded
    child tries what the CLI will be refused (`egress_guard.self_test`), as the CLI's user and
    with the environment the guard will have."""
    from sidecar.config import ConfigError
    from sidecar.egress import guard as egress_guard
    from sidecar.security import loader_env, users

    env = users.user_env(config.child_env, config.user, config.cli_home)
    problem = egress_guard.self_test(  # 127.0.0.1:1: refused by nothing but no listener
        [("127.0.0.1", 1)], env=loader_env.split(env)[0], user=config.user
    )
    if problem is not None:
        msg = f"SIDECAR_EGRESS_ALLOW is set but the CLI's network cannot be closed here: {problem}"
        raise ConfigError(msg)


def _prepare_audit_dir(path: Path) -> None:
    """SIDECAR_AUDIT_DIR: made 0700 if missing; one others can write is refused (the trail's
    records must be the sidecar's alone)."""
    import stat

    from sidecar.config import ConfigError

    try:
        if not os.path.lexists(path):
            path.mkdir(mode=0o700, parents=True)
        st = os.stat(path)
    except OSError as exc:
        msg = f"SIDECAR_AUDIT_DIR: cannot make {path}: {exc.strerror}"
        raise ConfigError(msg) from None
    if not stat.S_ISDIR(st.st_mode):
        msg = f"SIDECAR_AUDIT_DIR: {path} is not a directory"
        raise ConfigError(msg)
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        msg = f"SIDECAR_AUDIT_DIR: {path} is not private to the sidecar (owner or mode)"
        raise ConfigError(msg)


def _hide_environment(env: dict[str, str]) -> tuple[str, ...] | None:
    """Before anything else: this process's environment block (what /proc/<pid>/environ shows
    to the CLI when it runs as the same user) must not keep the tokens, nor the variables the
    secrets file takes real values from (returned): when it holds one, this program starts
    again without them. None when that fails (said on stderr)."""
    # Only what the re-exec needs is imported before it: it is paid twice when it happens.
    from sidecar.security import tokens

    extra: tuple[str, ...] = ()
    if env.get(SECRETS, "").strip():
        from sidecar.config import ConfigError
        from sidecar.config.secrets import hidden_variables

        try:
            extra = hidden_variables(env)
        except ConfigError as exc:
            print(f"sidecar: {exc}", file=sys.stderr)
            return None
    if tokens.in_environment(env, extra):
        try:
            tokens.reexec_without_tokens(env, extra)
        except OSError as exc:
            print(
                f"sidecar: cannot start again without the tokens in its environment: {exc}",
                file=sys.stderr,
            )
            return None
    return extra


def _keep_secrets(config: Config, extra: tuple[str, ...]) -> bool:
    """The secrets' variables gone from os.environ; with secrets, init (and every supervisor
    it forks) non-dumpable and without core dumps: in one-uid mode the CLI could otherwise
    read the real values from its memory. False when that cannot be had (said on stderr)."""
    for name in extra:
        os.environ.pop(name, None)  # read once, into the configuration
    if not config.secrets:
        return True
    from sidecar.security import sealed  # ctypes: init pays for it only with secrets

    try:
        sealed.seal()
    except OSError as exc:
        print(
            f"sidecar: {SECRETS}: cannot keep the real values from the CLI: {exc}", file=sys.stderr
        )
        return False
    return True


def _api_sockets(host: str, port: int) -> list[socket.socket]:
    """The API's listening sockets, made once by init and handed to every supervisor it starts
    (a fork), as socket activation would: the port is never free while the sidecar runs, not
    even between a supervisor's crash and the next one, so nothing else can take it. No
    SO_REUSEPORT: a process of the same uid could otherwise share the port."""
    made: list[socket.socket] = []
    try:
        for family, kind, proto, _name, addr in socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        ):
            sock = socket.socket(family, kind, proto)
            made.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(128)
    except OSError:
        for sock in made:
            sock.close()
        raise
    return made


def _take_user_group(config: Config) -> None:
    """SIDECAR_USER: check that the capabilities to switch users are there, and make the CLI
    user's group the sidecar's only supplementary one (see `sidecar.process.statedir`)."""
    from sidecar.config import ConfigError
    from sidecar.security import caps

    assert config.user is not None
    missing = caps.NEEDED_CAPS - caps.current_caps()
    if missing:
        adds = " ".join(f"--cap-add {caps.CAP_NAMES[c]}" for c in sorted(missing))
        msg = (
            f"SIDECAR_USER: running the CLI as another user needs the capabilities "
            f"{caps.cap_names(caps.NEEDED_CAPS)}; this process lacks {caps.cap_names(missing)} "
            f"(docker run {adds})"
        )
        raise ConfigError(msg)
    os.setgroups([config.user.gid])


def _drop_privileges() -> None:
    """With SIDECAR_USER, init and the supervisor keep only what they use from here on (the
    API's port is bound already, so not NET_BIND_SERVICE even below 1024)."""
    from sidecar.security import caps

    caps.keep_only(caps.NEEDED_CAPS)


async def serve(
    config: Config,
    registry: dict[str, CLIDef],
    incarnation: Incarnation,
    listening: list[socket.socket],
    link_key: bytes,
) -> int:
    """Run until SIGTERM/SIGINT: API first (so /health answers at once, on init's `listening`
    sockets), then the processes (started, or after a crash adopted). A task of the supervisor
    that fails ends it with 1 and nothing stopped: init starts a new one, which adopts what
    runs. `link_key`: what notification links are signed with, init's (so a restarted
    supervisor knows old links)."""
    import asyncio
    import signal

    from aiohttp import web

    from sidecar.api.app import create_app
    from sidecar.core.events import EventBus
    from sidecar.process.deaths import REAPED
    from sidecar.process.supervisor import Supervisor

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        # Handlers only flag; the loop does the work.
        loop.add_signal_handler(sig, stop.set)
    sup = Supervisor(
        config,
        registry,
        EventBus(),
        restarts=incarnation.restarts,
        started=incarnation.started,
        link_key=link_key,
    )
    # SIGHUP reads the allow file and the policy again (the work is a task of the loop's).
    loop.add_signal_handler(signal.SIGHUP, sup.rules.reload)
    # Now a SIGTERM has somewhere to go: the ones init held back since the fork arrive here.
    incarnation.release_signals()
    if incarnation.reaped is not None:
        REAPED.listen(incarnation.reaped)  # how init's orphans die: the tmux server is one
    # handler_cancellation: a handler whose client went away is cancelled at once instead of
    # holding its buffers; shutdown_timeout bounds how long shutdown waits for the rest (open
    # streams are ended by the app's on_shutdown hooks first).
    runner = web.AppRunner(
        create_app(sup),
        access_log=None,
        handle_signals=False,
        handler_cancellation=True,
        shutdown_timeout=SHUTDOWN_TIMEOUT,
    )
    await runner.setup()
    for sock in listening:
        await web.SockSite(runner, sock).start()
    log.info("API listening on http://%s:%d", config.host, config.port)
    if await sup.start(stop_at_once=incarnation.stop):
        stop.set()
    stopped = asyncio.ensure_future(stop.wait())
    crashed = asyncio.ensure_future(sup.crashed.wait())
    await asyncio.wait([stopped, crashed], return_when=asyncio.FIRST_COMPLETED)
    if not stop.is_set():
        stopped.cancel()
        # Leave tmux and the CLI as they are (ttyd dies with us): the next supervisor adopts.
        log.critical("supervisor crashed (a task failed): exiting for init to start a new one")
        return 1
    crashed.cancel()
    await sup.shutdown()
    await runner.cleanup()
    return 0


def run(env: dict[str, str]) -> int:
    from sidecar.security import tokens

    extra = _hide_environment(env)
    if extra is None:
        return 2
    from sidecar.config import ConfigError

    handed = tokens.take_over(env, extra)  # also takes the descriptor's variable out of env
    env = {**env, **handed}
    try:
        # The lock's descriptor is never closed: init holds it, and every supervisor it forks.
        config, registry, _lock = _load(env)
    except ConfigError as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the kernel refused setgroups
        print(f"sidecar: SIDECAR_USER: cannot drop privileges: {exc}", file=sys.stderr)
        return 2
    if not _keep_secrets(config, extra):
        return 2
    try:
        listening = _api_sockets(config.host, config.port)
    except OSError as exc:
        reason = "the port is already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        where = f"{config.host}:{config.port}"
        print(f"sidecar: SIDECAR_PORT: cannot listen on {where}: {reason}", file=sys.stderr)
        return 2
    try:
        if config.user is not None:
            _drop_privileges()
    except OSError as exc:  # the kernel refused capset
        print(f"sidecar: SIDECAR_USER: cannot drop privileges: {exc}", file=sys.stderr)
        return 2
    if config.cli not in registry:
        # Not fatal: the sidecar serves degraded (the terminal and /status say why) and a
        # resleeve to a known CLI recovers, as supervisord keeps running with a FATAL program.
        known = ", ".join(sorted(registry))
        print(f"sidecar: SLEEVE_CLI: unknown CLI {config.cli!r}; known: {known}", file=sys.stderr)

    # Made here, in init, before the first fork: every supervisor init starts inherits it, so
    # links survive a crash, and it exists in memory only (never on disk or in an environment).
    link_key = os.urandom(32)

    def work(incarnation: Incarnation) -> int:
        import asyncio

        from sidecar.core.logs import setup_logging

        setup_logging()
        try:
            return asyncio.run(serve(config, registry, incarnation, listening, link_key))
        except Exception:  # a bug: one JSON log line with the traceback, then init's restart
            log.critical("supervisor crashed", exc_info=True)
            return 1

    from sidecar.process.init import run_as_init

    return run_as_init(work, grace=config.stop_grace)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] == "run":
        if args[1:] and args[1] in ("-h", "--help"):
            print(__doc__)
            return 0
        return run(dict(os.environ))
    from sidecar.cli import client_main

    return client_main(args)
