"""Entry point wiring: `sidecar run` validates the configuration, becomes the init process and
runs the supervisor plus the HTTP API in its child; other subcommands are API clients."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import sys

from sidecar.config import Config, ConfigError

log = logging.getLogger("sidecar")


def _load(env: dict[str, str]) -> tuple[Config, dict[str, object]]:
    from sidecar.clis import load_registry

    config = Config.from_env(env)
    shell = env.get("SHELL") or "/bin/bash"
    registry = load_registry(
        config.cli_config, login_shell=shell if os.path.isabs(shell) else "/bin/bash"
    )
    if config.cli not in registry:
        msg = f"SLEEVE_CLI: unknown CLI {config.cli!r}; known: {', '.join(sorted(registry))}"
        raise ConfigError(msg)
    return config, dict(registry)


async def serve(config: Config, registry: dict[str, object]) -> int:
    """Run until SIGTERM/SIGINT: API first (so /health answers at once), then the processes."""
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

    sup = Supervisor(config, registry, EventBus())  # type: ignore[arg-type]
    runner = web.AppRunner(create_app(sup), access_log=None, handle_signals=False)
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
        return 2
    log.info("API listening on http://%s:%d", config.host, config.port)
    try:
        await sup.start()
        await stop.wait()
    finally:
        await sup.shutdown()
        await runner.cleanup()
    return 0


def run(env: dict[str, str]) -> int:
    try:
        config, registry = _load(env)
    except ConfigError as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return 2

    def work() -> int:
        from sidecar.logs import setup_logging

        setup_logging()
        return asyncio.run(serve(config, registry))

    from sidecar.init import run_as_init

    return run_as_init(work)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] == "run":
        if args[1:] and args[1] in ("-h", "--help"):
            print(__doc__)
            return 0
        return run(dict(os.environ))
    from sidecar.cli import client_main

    return client_main(args)
