"""Owns the sleeve's processes: the CLI in its tmux pane (`sidecar.process.cli_runner`) and ttyd
beside it (`sidecar.process.ttyd_runner`), composed with the state file that lets a supervisor
started again after a crash adopt what runs (`sidecar.process.persist`, `sidecar.process.adopt`,
`sidecar.process.takeover`), the resleeve (`sidecar.process.resleeve`), the once-a-second tick
and the shutdown order.

Process exits are noticed through pidfds on the event loop, never by polling tmux. Every change
of state is saved when it happens, never on a timer.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import time
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

from sidecar.agent.awareness import Awareness
from sidecar.agent.registry import CLIDef
from sidecar.config import Config
from sidecar.core.contract import rfc3339
from sidecar.core.event_shapes import ErrorEvent
from sidecar.core.events import EventBus
from sidecar.core.proc import send_signal
from sidecar.core.states import ProcState, ProcStatus
from sidecar.egress.fence import crowded_temp, fence_of
from sidecar.egress.service import Egress
from sidecar.notify.service import Notifier
from sidecar.pane import tmux_version
from sidecar.pane.tmux import PaneInfo, Tmux
from sidecar.process import adopt, cli_status, persist, takeover
from sidecar.process.cli_runner import CliRunner
from sidecar.process.credentials import credentials
from sidecar.process.governance import Governance, open_trail
from sidecar.process.persist import ProcRef, SupervisorState
from sidecar.process.pidfd import wait_exited
from sidecar.process.resleeve import Resleeves
from sidecar.process.stats import SupervisorStats
from sidecar.process.ttyd_runner import TtydRunner, stop_stale
from sidecar.security import loader_env, users
from sidecar.security.acting import acting, workspace_owner
from sidecar.security.tokens import TOKEN_VARS
from sidecar.workspace import cstack_files
from sidecar.workspace.watch import CurrentWatcher

log = logging.getLogger(__name__)

TICK = 1.0  # the only periodic work: one stat of CURRENT.md and of the tmux socket


class Supervisor:
    def __init__(
        self,
        config: Config,
        registry: Mapping[str, CLIDef],
        bus: EventBus,
        *,
        restarts: int = 0,
        started: float | None = None,
        link_key: bytes | None = None,
    ) -> None:
        self.config = config
        self.registry = dict(registry)
        self.bus = bus
        # The secrets' placeholders (the CLI's variables) and the proxy's swap for the values.
        self.credentials = credentials(config)
        # With SIDECAR_USER: the CLI's environment (its HOME), and how the sidecar acts in the
        # workspace (as that user; see sidecar.security.acting). Without it: the sidecar's own.
        cli_env = users.user_env(config.child_env, config.user, config.cli_home)
        # Everything around the CLI (tmux, ttyd, the pane's waiter, the egress guard) runs
        # without the loader variables; the CLI gets them with its own (`LaunchPlanner`).
        outside = loader_env.split(cli_env)[0]
        user_env = outside if config.user is not None else None
        self.owner = workspace_owner(config.user, config.workspace, os.geteuid())
        self.ttyd = TtydRunner(
            port=config.ttyd_port,
            paths=config.paths,
            path_env=config.child_env.get("PATH"),
            bus=bus,
            on_change=self._save,
            run_as=config.user,
            env=user_env,
        )
        # The sidecar's start (init's), not this supervisor's: /health's uptime survives a crash.
        self.started = time.monotonic() if started is None else started
        self.restarts = restarts  # supervisors that ran before this one (crashed)
        self.restarted_at = rfc3339() if restarts else None
        # Set when a task of ours failed: `main` then ends this supervisor without stopping
        # anything, and init starts a new one that adopts what runs (crash-only).
        self.crashed = asyncio.Event()
        self.warnings: list[str] = []
        self.stats = SupervisorStats()
        self.current = CurrentWatcher(
            config.workspace / ".cstack" / "CURRENT.md", bus, config.workspace, self.owner
        )
        self.tmux = Tmux(config.paths, run_as=config.user, env=user_env)
        # Every decision, egress connection, list change and resleeve is appended here.
        self.audit = open_trail(config, bus)
        # What the agent is doing (sidecar.agent.machine): told of every change of the CLI's state.
        self.awareness = Awareness(config, bus, self.tmux, self.owner, self.audit)
        # The CLI's egress allowlist: the proxy, and every refused attempt's one door.
        self.egress = Egress(
            config.egress,
            bus,
            (config.host, config.port),
            audit=self.audit,
            owner=self.owner,
            ask_seconds=config.egress_ask,
            secrets=self.credentials.substitution,
        )
        # The policy and the allow file read again on SIGHUP; held egress requests asked.
        self.rules = Governance(config, bus, self.awareness.approvals, self.egress, self.audit)
        # Notifications, from the bus; its links outlive a crash (`link_key` is init's).
        self.notifier = Notifier(
            config,
            bus,
            self.awareness.machine,
            self.awareness.approvals,
            link_key=link_key,
            generation=restarts,
        )
        self._stopping = False
        self._started = False  # `start` has launched or taken over the CLI
        self._tasks: set[asyncio.Task[None]] = set()
        self.state_file = persist.StateFile(config.paths.supervisor_state)
        self._init = ProcRef.of(os.getppid())  # None: no more saves
        self.runner = CliRunner(
            config,
            self.registry,
            bus,
            tmux=self.tmux,
            awareness=self.awareness,
            stats=self.stats,
            env=cli_env,
            owner=self.owner,
            spawn=self._spawn,
            save=self._save,
        )
        self.resleeves = Resleeves(
            self.runner, self.registry, bus, self.stats, spawn=self._spawn, save=self._save
        )

    # ---- what the API reads ----------------------------------------------------------------

    @property
    def cli(self) -> ProcStatus:
        return self.runner.status

    @property
    def cli_name(self) -> str:
        return self.runner.name

    @property
    def pane(self) -> PaneInfo | None:
        return self.runner.server.pane

    @property
    def healthy(self) -> bool:
        return self.cli.state is ProcState.RUNNING

    @property
    def resleeving(self) -> bool:
        return self.resleeves.busy

    # ---- tasks and the state file ----------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.critical("task %s failed", task.get_name(), exc_info=task.exception())
            self.bus.publish(ErrorEvent(message=f"internal task {task.get_name()} failed"))
            # A failed task leaves state nobody can trust: crash, be started again, adopt.
            if not self._stopping:
                self.crashed.set()

    def _save(self) -> None:
        """Write the state file when something in it changed: the CLI's record as its last move
        made it, ttyd's, and the supervisor's own (set in `start` before the first move, the
        resleeve's under way, a shutdown's)."""
        if self._init is None:
            return
        move = self.resleeves.move
        record = SupervisorState(
            init=self._init,
            resleeve_from=move[0] if move else None,
            resleeve_to=move[1] if move else None,
            stopping=self._stopping,
            ttyd=self.ttyd.status.process,
            warnings=tuple(self.warnings),
            egress_port=self.egress.port,
            **cli_status.fields_of(self.runner.status),
        )
        self.state_file.save(record)

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self, *, stop_at_once: bool = False) -> bool:
        """Start tmux with the CLI, and ttyd beside it; after a crash, take over what runs.
        Returns whether to shut down at once: init asked (`stop_at_once`: a SIGTERM came while
        no supervisor was running, or the last one died after it), or the dead supervisor had
        begun a shutdown. Then nothing new is started. The state dir exists already (0700):
        `main` makes it before anything starts, so that an unusable one is a configuration
        error."""
        notify_vars = (v for v in os.environ if v.startswith("SIDECAR_NOTIFY_"))
        for var in [*TOKEN_VARS, *notify_vars, *filter(loader_env.is_loader_var, os.environ)]:
            # Children (tmux, the CLI, ttyd) must not inherit the API's tokens, nor learn where
            # notifications go, nor (but for the CLI itself, which gets them through its
            # launch) the loader variables.
            os.environ.pop(var, None)
        record, found = persist.load(self.state_file.path)
        ours = record if record is not None and record.init == self._init else None
        if ours is not None and ours.ttyd is not None:
            await stop_stale(ours.ttyd, self.config.paths.tmux_socket)
        if stop_at_once or (ours is not None and ours.stopping):
            live = await takeover.find_pane(self.tmux, ours)
            self.runner.stop_only(live, ours)
            log.warning(
                "supervisor restart %d: shutting down at once (found %s)",
                self.restarts,
                adopt.found_text(live),
            )
            return True
        # Listening before anything is listed: approvals an adopted CLI waits on come early.
        self.notifier.start()
        # Before the CLI: its environment names the proxy, on the port an adopted CLI knows.
        await self.egress.start(ours.egress_port if ours is not None else None)
        trust: dict[str, str] = {}
        if self.egress.started:
            trust = await self.egress.terminate_tls(self.config.paths, self.config.egress_ca_file)
            self._guard_cli()
        # The CLI's alone (never tmux's or ttyd's): the proxy, the secrets' placeholders, and
        # the sleeve's CA that the proxy terminates TLS with for their hosts.
        self.runner.plans.egress_env = {**self.egress.env(), **self.credentials.env, **trust}
        await self._prepare_workspace(ours)
        old_tmux = tmux_version.warning(await asyncio.to_thread(self.tmux.version))
        if old_tmux is not None:
            self._warn(old_tmux)
        self.current.get()
        if self.restarts and (left := self.awareness.activity.stop_orphans(os.getppid())):
            log.warning("stopped %d tmux control clients a dead supervisor left", left)
        self.awareness.start()
        # ttyd starts beside the CLI, not after it: it needs the tmux session only when a
        # browser attaches, and /terminal must be usable as soon as /health says healthy.
        self._spawn(self.ttyd.run(), "ttyd")
        async with self.runner.lock:
            if record is None and not self.restarts:
                await self.runner.launch(resume=False, fresh_server=True)  # a first start
            else:
                await self._take_over(record, found)
        self._started = True
        self._spawn(self._tick(), "tick")
        return False

    def _warn(self, warning: str) -> None:
        """A start-time warning: logged and kept for /status once, however often it starts."""
        if warning not in self.warnings:
            log.warning("%s", warning)
            self.warnings.append(warning)

    def _guard_cli(self) -> None:
        """The egress guard around every launch from now on, and its reports taken from the
        broker beside the running CLI alone."""
        cfg, paths = self.config, self.config.paths
        user = cfg.user
        uid = user.uid if user is not None else os.geteuid()
        self.egress.listen_reports(
            paths.egress_reports,
            lambda pid, sender: sender == uid and self.runner.is_guard(pid),
            group=user.gid if user is not None else None,
        )
        home = self.runner.plans.env.get("HOME")
        fence = fence_of(
            paths,
            one_uid=user is None,
            root_cli=user is None and os.geteuid() == 0,
            writable=(cfg.workspace, *([Path(home)] if home else [])),
            trusted=[path for _name, path in cfg.trusted_paths],
            private=[path for _name, path in cfg.credential_files],
        )
        for warning in crowded_temp([("SIDECAR_STATE_DIR", paths.state_dir), *cfg.trusted_paths]):
            self._warn(warning)
        self.runner.plans.egress_guard = functools.partial(
            self.egress.guard,
            deny_unix=(paths.tmux_socket, paths.ttyd_socket),
            fence=fence,
            env_file=paths.cli_env,
        )

    async def _prepare_workspace(self, ours: SupervisorState | None) -> None:
        """The workspace made by, and checked for, the CLI's user; SLEEVE_GOAL into CURRENT.md
        at a first start; the warnings a dead supervisor had found."""
        cfg = self.config
        with acting(self.owner):
            try:
                cfg.workspace.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                self.warnings.append(f"workspace {cfg.workspace} cannot be created: {exc.strerror}")
            if cfg.workspace.is_dir() and not os.access(
                cfg.workspace, os.W_OK, effective_ids=os.access in os.supports_effective_ids
            ):
                who = f" for SIDECAR_USER {cfg.user.spec}" if cfg.user else ""
                self.warnings.append(f"workspace {cfg.workspace} is read-only{who}")
        if cfg.goal and not self.restarts:  # a restart must not undo the agent's own edits
            try:
                await asyncio.to_thread(
                    cstack_files.write_goal, self.current.path, cfg.goal, cfg.workspace, self.owner
                )
            except OSError as exc:
                self.warnings.append(f"SLEEVE_GOAL not written to CURRENT.md: {exc.strerror}")
        if ours is not None:
            self.warnings += [w for w in ours.warnings if w not in self.warnings]

    async def _take_over(self, record: SupervisorState | None, found: str) -> None:
        """After a crash: adopt what the state file names if it matches what runs, else heal
        or start afresh (caller holds the runner's lock): the supervisor observes what runs,
        `adopt.decide` decides, `takeover.carry_out` acts. Logs one line: what was found, what
        was adopted or started, and why."""
        live = await takeover.find_pane(self.tmux, record)
        seen = takeover.observe(live, record)
        argvs = adopt.argvs_of(record, self.registry) if record is not None else set()
        decision = adopt.decide(record, found, self._init, seen, argvs)
        plan = decision.plan
        await takeover.carry_out(self.runner, plan, record, live)
        log.warning(
            "supervisor restart %d: %s (%s; found %s): CLI %s %s, pid %s; ttyd restarted",
            self.restarts,
            "adopted" if plan is adopt.Plan.ADOPT else plan.value,
            decision.why,
            adopt.found_text(live),
            self.runner.name,
            self.cli.state.value,
            self.cli.pid,
        )
        if record is not None and plan is not adopt.Plan.FRESH and record.resleeve_to is not None:
            # A resleeve the dead supervisor began is finished, never undone half way.
            stop_first = plan is adopt.Plan.ADOPT and record.cli_state == ProcState.STOPPING.value
            previous = record.resleeve_from or record.cli
            log.warning("finishing the resleeve %s -> %s", previous, record.resleeve_to)
            await self.resleeves.finish(previous, record.resleeve_to, stop_first=stop_first)

    # ---- resleeve ------------------------------------------------------------------------

    def begin_resleeve(self, cli_name: str | None) -> tuple[str, asyncio.Task[None]]:
        """`Resleeves.begin`: raises UnknownCLI or ResleeveBusy before anything happens. None is
        taken before `start` has launched or taken over the CLI: the API listens first, and a
        resleeve then would launch into a server the takeover had not looked at yet, which it
        then stops, leaving a CLI that ignores SIGHUP running beside the new one."""
        refused = None if self._started else "the sidecar is starting"
        if self._stopping:
            refused = "shutting down"
        return self.resleeves.begin(cli_name, refused=refused)

    # ---- periodic ------------------------------------------------------------------------

    async def _tick(self) -> None:
        socket = os.fspath(self.config.paths.tmux_socket)
        while not self._stopping:
            await asyncio.sleep(TICK)
            self._tick_once(socket)

    def _tick_once(self, socket: str) -> None:
        """The only periodic work: a few `stat` calls (it is most of an idle sleeve's CPU)."""
        self.current.get()  # CURRENT.md edits become events within a second
        self.awareness.tick()  # an inbox notice, if one is due
        server = self.runner.server
        if server.pane is not None and not os.path.exists(socket):
            log.warning("tmux socket %s vanished; asking tmux to recreate it", socket)
            server.recreate_socket()

    # ---- shutdown ------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """CLI tree (within the grace), then ttyd, then tmux; CURRENT.md says `killed`."""
        if self._stopping:
            return
        self._stopping = True
        log.info("shutting down")
        # First: the CLI stopped on purpose is nobody's news.
        await self.notifier.close()
        # A supervisor that crashes from here on is started again only to finish this.
        self._save()
        run = self.runner
        run.stopping = True
        run.unwatch()
        # A resleeve or heal under way finishes its stop first and then starts nothing
        # (`launch` checks `stopping`); only then is the pane's tree stopped here.
        async with run.lock:
            await run.stop()
        await self.awareness.stop()
        await self.egress.close()
        await self.rules.close()
        await self.ttyd.stop()
        server = run.server.ref
        await asyncio.to_thread(self.tmux.kill_server)
        # kill-server returns once the tmux client is done; the server exits a moment later.
        # Wait for it, so that it never outlives us (as PID 1's last act, that would leave it to
        # the kernel's SIGKILL). A server that does not exit (it waits for a client that waits
        # for it: seen after faults) is killed, if it is still that process.
        if server is not None and await wait_exited([server.pid], 1.0):
            log.warning("tmux server %d did not exit on kill-server; SIGKILL", server.pid)
            send_signal(server.pid, server.start, signal.SIGKILL)
            await wait_exited([server.pid], 1.0)
        self._init = None  # nothing is left to adopt: no more saves
        run.stopped()
        try:
            await asyncio.to_thread(
                cstack_files.write_status,
                self.current.path,
                "killed",
                self.config.workspace,
                self.owner,
            )
        except OSError as exc:
            log.warning("could not mark CURRENT.md killed: %s", exc)
        self.state_file.remove()
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        log.info("stopped")
