"""Entry point wiring: `sidecar run` validates the configuration, becomes the init process and
runs the supervisor plus the HTTP API in its child; other subcommands are API clients."""

from __future__ import annotations

import errno
import logging
import os
import sys
from typing import TYPE_CHECKING

from sidecar.config import Config, ConfigError

if TYPE_CHECKING:
    from sidecar.clis import CLIDef
    from sidecar.init import Incarnation

# The init process (PID 1) stays small: asyncio, aiohttp and the rest are imported in its child
# only. Whatever init has imported before the fork is a copy the supervisor does not need.

log = logging.getLogger("sidecar")
SHUTDOWN_TIMEOUT = 2.0  # seconds the API waits for requests still running at shutdown


def _load(env: dict[str, str]) -> tuple[Config, dict[str, CLIDef]]:
    from sidecar.clis import load_registry

    config = Config.from_env(env)
    shell = env.get("SHELL") or "/bin/bash"
    registry = load_registry(
        config.cli_config, login_shell=shell if os.path.isabs(shell) else "/bin/bash"
    )
    _prepare_state_dir(config)
    return config, dict(registry)


def _prepare_state_dir(config: Config) -> None:
    """Create SIDECAR_STATE_DIR (0700) now, so an unusable one is a config error (exit 2)."""
    state = config.state_dir
    try:
        state.mkdir(mode=0o700, parents=True, exist_ok=True)
        state.chmod(0o700)
        probe = state / ".probe"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        msg = f"SIDECAR_STATE_DIR: {state} is not a usable directory: {exc.strerror}"
        raise ConfigError(msg) from None
    # A unix socket path must fit in sun_path (108 bytes with its NUL).
    if len(os.fsencode(config.tmux_socket)) > 107:
        msg = f"SIDECAR_STATE_DIR: {state} is too long for a socket path inside it (max ~98 bytes)"
        raise ConfigError(msg)


async def serve(config: Config, registry: dict[str, CLIDef], incarnation: Incarnation) -> int:
    """Run until SIGTERM/SIGINT: API first (so /health answers at once), then the processes
    (started, or after a crash adopted). A task of the supervisor that fails ends it with 1
    and nothing stopped: init starts a new one, which adopts what runs."""
    import asyncio
    import signal

    from aiohttp import web

    from sidecar.api import create_app
    from sidecar.events import EventBus
    from sidecar.supervisor import Supervisor

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        # Handlers only flag; the loop does the work.
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: log.info("SIGHUP ignored"))
    # Now a SIGTERM has somewhere to go: the ones init held back since the fork arrive here.
    incarnation.release_signals()

    sup = Supervisor(
        config,
        registry,
        EventBus(),
        restarts=incarnation.restarts,
        started=incarnation.started,
    )
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
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        reason = "the port is already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        print(
            f"sidecar: SIDECAR_PORT: cannot listen on {config.host}:{config.port}: {reason}",
            file=sys.stderr,
        )
        # At a restart the port was fine a moment ago: a crash (init tries again), not exit 2.
        return 1 if incarnation.restarts else 2
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
    try:
        config, registry = _load(env)
    except ConfigError as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return 2
    if config.cli not in registry:
        # Not fatal: the sidecar serves degraded (the terminal and /status say why) and a
        # resleeve to a known CLI recovers, as supervisord keeps running with a FATAL program.
        known = ", ".join(sorted(registry))
        print(f"sidecar: SLEEVE_CLI: unknown CLI {config.cli!r}; known: {known}", file=sys.stderr)

    def work(incarnation: Incarnation) -> int:
        import asyncio

        from sidecar.logs import setup_logging

        setup_logging()
        try:
            return asyncio.run(serve(config, registry, incarnation))
        except Exception:  # a bug: one JSON log line with the traceback, then init's restart
            log.critical("supervisor crashed", exc_info=True)
            return 1

    from sidecar.init import run_as_init

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
