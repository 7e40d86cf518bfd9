"""Randomized fault injection (issue 20, "every fault heals"): SIGKILLs of the tmux server, the
CLI, ttyd and the supervisor at random moments, several at once, with concurrent resleeves and
inbox and outbox traffic; the sleeve must come back to one tmux server, one CLI and one ttyd
after every burst, and lose or double no message.

A fixed seed per run, so that a failure replays: SIDECAR_FAULT_SEED=N (or N,M,...) runs those
seeds; otherwise FIXED_SEEDS plus one derived from pytest-randomly's seed (printed at the end
of every run). The seed is in the test's id and in every failure message. Real processes
throughout; the only randomness is in the test's plan and its pacing.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.client import HTTPException
from pathlib import Path
from typing import Any

import pytest

from sidecar.process.init import MAX_CRASHES
from tests.harness import (
    CLIS,
    Proc,
    Sidecar,
    http,
    live_processes,
    py_cli,
    wait_for,
    write_cli_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

SEED_ENV = "SIDECAR_FAULT_SEED"
FIXED_SEEDS = (20, 4242)
BURSTS = 5
GRACE = 1  # SIDECAR_STOP_GRACE: the stubborn CLI costs a grace at every stop
# Bursts of a run that kill each process at most. The CLI and ttyd: each kill of one that ran
# less than 10 s doubles its backoff (1, 2, 4 s), which RECOVER_WITHIN has to cover. The
# supervisor: init gives up at MAX_CRASHES crashes within a minute; a run stays below.
MAX_KILLS = {"cli": 3, "ttyd": 3, "supervisor": MAX_CRASHES - 2}
RECOVER_WITHIN = 20.0  # seconds from a burst's end until the sleeve is whole again
WRITER = Path(__file__).resolve().parent / "needlecast_writer.py"
SCRIPTS = (str(CLIS / "pidfile.py"), str(CLIS / "stubborn.py"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "seed" not in metafunc.fixturenames:
        return
    given = os.environ.get(SEED_ENV, "").strip()
    if given:
        seeds = [int(s) for s in given.split(",")]
    else:
        seeds = list(FIXED_SEEDS)
        order = metafunc.config.getoption("randomly_seed", None)
        if isinstance(order, int) and order not in seeds:
            seeds.append(order)
    metafunc.parametrize("seed", seeds, ids=[f"seed={s}" for s in seeds])


# ---- the sleeve's processes ------------------------------------------------------------------


@dataclass(frozen=True)
class Census:
    """The sleeve's processes at one moment (from one scan of /proc)."""

    servers: list[Proc]  # tmux servers on our socket
    tmux: list[Proc]  # every tmux process on our socket: servers and clients
    cli_procs: list[Proc]  # every process running one of our CLIs' scripts
    ttyds: list[Proc]
    supervisors: list[Proc]  # init's children that run init's own command line
    procs: dict[int, Proc]

    @property
    def clis(self) -> list[Proc]:
        """The CLIs themselves: a CLI's own forks (stubborn's child) are not counted again."""
        ours = {p.pid for p in self.cli_procs}
        return [p for p in self.cli_procs if p.ppid not in ours]

    def under(self, root: int, proc: Proc) -> bool:
        """`proc` is `root` or one of its descendants."""
        seen = set()
        while proc.pid != root and proc.ppid in self.procs and proc.pid not in seen:
            seen.add(proc.pid)
            proc = self.procs[proc.ppid]
        return proc.pid == root


def census(sc: Sidecar, init: int | None = None) -> Census:
    """The processes of `sc` now; its supervisors only when its init's pid is given."""
    sock = str(sc.state_dir / "tmux.sock")
    marker = str(sc.tmp)
    procs = {p.pid: p for p in live_processes()}
    on_sock = [p for p in procs.values() if any(sock in a for a in p.argv)]
    init_argv = procs[init].argv if init is not None and init in procs else None
    return Census(
        servers=[p for p in on_sock if p.name == "tmux: server"],
        tmux=[p for p in on_sock if p.name.startswith("tmux")],
        cli_procs=[
            p
            for p in procs.values()
            if p.argv[:1] == (sys.executable,)
            and p.argv[1:2]
            and p.argv[1] in SCRIPTS
            and any(marker in a for a in p.argv[2:])
        ],
        ttyds=[p for p in on_sock if p.name == "ttyd"],
        supervisors=[
            p for p in procs.values() if p.ppid == init and init_argv and p.argv == init_argv
        ],
        procs=procs,
    )


def not_whole(sc: Sidecar, killed: frozenset[int] = frozenset()) -> str | None:
    """Why the sleeve is not whole now (None: it is): healthy, its CLI and ttyd running, no
    resleeve under way, one tmux server on its socket, one CLI (the one /status names, with
    nothing of an older CLI left), one ttyd, one supervisor, and none of them a process in
    `killed` (a view from before the supervisor noticed a kill is not a recovery)."""
    assert sc.proc is not None
    code, health = sc.get("/health")
    if code != 200 or health.get("status") != "healthy":
        return f"/health {code} {health}"
    code, s = sc.get("/status")
    if code != 200:
        return f"/status {code} {s}"
    if not s["cli_running"] or s["ttyd_state"] != "running" or s["resleeving"]:
        keys = ("cli", "cli_state", "cli_pid", "ttyd_state", "resleeving", "warnings")
        shown = {k: s[k] for k in keys}
        return f"/status {shown}"
    c = census(sc, sc.proc.pid)
    clis = c.clis
    problems = []
    if len(c.servers) != 1:
        problems.append(f"tmux servers {[p.pid for p in c.servers]}")
    if [p.pid for p in clis] != [s["cli_pid"]]:
        problems.append(f"CLIs {[p.pid for p in clis]}, /status says {s['cli_pid']}")
    elif any(not c.under(clis[0].pid, p) for p in c.cli_procs):
        problems.append(f"processes of an older CLI left: {c.cli_procs}")
    if len(c.ttyds) != 1:
        problems.append(f"ttyds {[p.pid for p in c.ttyds]}")
    if len(c.supervisors) != 1:
        problems.append(f"supervisors {[p.pid for p in c.supervisors]}")
    now = {p.pid for p in [*c.servers, *clis, *c.ttyds, *c.supervisors]} | {s["cli_pid"]}
    if now & killed:
        problems.append(f"killed processes still counted: {sorted(now & killed)}")
    return "; ".join(problems) or None


def wait_whole(
    sc: Sidecar, timeout: float, what: str, killed: frozenset[int] = frozenset()
) -> float:
    """Wait until the sleeve is whole; the seconds it took. Fails with the last reason."""
    began = time.monotonic()
    last: list[str] = []

    def whole() -> bool:
        why = not_whole(sc, killed)
        if why is not None:
            last[:] = [why]
        return why is None

    try:
        wait_for(whole, timeout=timeout, interval=0.05, what=what)
    except AssertionError:
        raise AssertionError(f"{what}: not whole after {timeout:g}s: {last}") from None
    return time.monotonic() - began


# ---- the plan --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    at: float  # seconds after the burst begins
    kind: str  # kill | resleeve | inbox | outbox | ack
    arg: Any = None

    def __str__(self) -> str:
        return f"{self.at:.3f}s {self.kind}{'' if self.arg is None else f' {self.arg}'}"


def plan(seed: int) -> list[list[Action]]:
    """The bursts of one run, drawn from `seed` alone."""
    rng = random.Random(seed)
    kills = dict.fromkeys(["tmux", "cli", "ttyd", "supervisor"], 0)
    bursts = []
    for n in range(BURSTS):
        actions = []
        targets = rng.sample(["tmux", "cli", "ttyd", "supervisor"], rng.randint(1, 3))
        targets = [t for t in targets if kills[t] < MAX_KILLS.get(t, BURSTS)]
        for target in targets:
            kills[target] += 1
        for target in targets or ["tmux"]:
            at = rng.uniform(0, 0.8)
            actions.append(Action(at, "kill", target))
            luck = rng.random()
            if target == "tmux" and luck < 0.4:
                # The heal's new server too, the moment it appears: the fault that ended the
                # sleeve for good.
                actions[-1] = Action(at, "kill", "tmux+new")
            elif target == "tmux" and luck < 0.7:
                # Again at a random moment of the heal.
                actions.append(Action(at + rng.uniform(0.0, 0.3), "kill", "tmux"))
        for _ in range(rng.choice([0, 0, 1, 2, 3])):
            cli = rng.choice([None, "alpha", "beta", "stubborn"])
            actions.append(Action(rng.uniform(0, 1.0), "resleeve", cli))
        for _ in range(rng.randint(0, 4)):
            actions.append(Action(rng.uniform(0, 1.0), "inbox"))
        if rng.random() < 0.6:
            actions.append(Action(rng.uniform(0, 1.0), "outbox", f"b{n}"))
        for _ in range(rng.randint(0, 2)):
            actions.append(Action(rng.uniform(0, 1.0), "ack", rng.randint(1, 3)))
        bursts.append(sorted(actions, key=lambda a: a.at))
    return bursts


# ---- the run ---------------------------------------------------------------------------------


@dataclass
class Ledger:
    """What the test did and saw; the invariants are checked against it."""

    seed: int
    rng: random.Random
    posted: dict[str, str | None] = field(default_factory=dict)  # content -> id (None: no answer)
    written: list[str] = field(default_factory=list)  # outbox ids the writer appended
    acked: set[str] = field(default_factory=set)  # ids an ack answered 200 for
    maybe_acked: set[str] = field(default_factory=set)  # ids of acks that got no answer
    bad_answers: list[str] = field(default_factory=list)
    status_polls: int = 0
    two_clis: list[str] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)  # every pid the test SIGKILLed
    samples: int = 0
    log: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, line: str) -> None:
        with self.lock:
            self.log.append(line)


def request(sc: Sidecar, method: str, path: str, body: Any = None) -> tuple[int | None, Any]:
    """One request; (None, the error) when no answer came (a supervisor killed meanwhile)."""
    try:
        return http(method, sc.url + path, body)
    except (OSError, ValueError, HTTPException) as exc:  # refused, reset, cut short
        return None, exc


def kill_new_server(sc: Sidecar, old: set[int], within: float = 3.0) -> tuple[int, float] | None:
    """SIGKILL the first tmux server on our socket that is not one of `old`, the moment it
    appears (a scan of /proc takes about a millisecond); its pid and the seconds from seeing
    it to the SIGKILL sent (None: none appeared within `within` seconds)."""
    sock = str(sc.state_dir / "tmux.sock")
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for p in live_processes():
            if p.name == "tmux: server" and p.pid not in old and any(sock in a for a in p.argv):
                seen = time.monotonic()
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
                return p.pid, time.monotonic() - seen
    return None


def kill(sc: Sidecar, target: str, ledger: Ledger) -> None:
    assert sc.proc is not None
    c = census(sc, sc.proc.pid)
    if target == "tmux+new":
        kill(sc, "tmux", ledger)
        new = kill_new_server(sc, {p.pid for p in c.servers})
        ledger.note(f"SIGKILL the new tmux server: {new}")
        if new is not None:
            ledger.killed.add(new[0])
        return
    victims = {
        "tmux": c.servers,
        "cli": c.cli_procs,  # the CLI's whole tree, as an OOM kill of its cgroup would
        "ttyd": c.ttyds,
        "supervisor": c.supervisors,
    }[target]
    for proc in victims:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    ledger.killed |= {p.pid for p in victims}
    ledger.note(f"SIGKILL {target}: {[p.pid for p in victims]}")


def act(sc: Sidecar, action: Action, ledger: Ledger) -> None:
    time.sleep(action.at)  # sleep-ok: pacing between injected faults
    if action.kind == "kill":
        kill(sc, action.arg, ledger)
    elif action.kind == "resleeve":
        code, body = request(
            sc, "POST", "/resleeve", {} if action.arg is None else {"cli": action.arg}
        )
        ledger.note(f"resleeve {action.arg}: {code}")
        if code is not None and code not in (202, 409):
            ledger.bad_answers.append(f"POST /resleeve {action.arg}: {code} {body}")
    elif action.kind == "inbox":
        with ledger.lock:
            content = f"fault {ledger.seed} message {len(ledger.posted)}"
            ledger.posted[content] = None
        message = {"from": "envoy", "type": "task", "content": content}
        code, body = request(sc, "POST", "/inbox", message)
        if code == 201:
            ledger.posted[content] = body["id"]
        elif code is not None:
            ledger.bad_answers.append(f"POST /inbox: {code} {body}")
    elif action.kind == "outbox":
        out = subprocess.run(
            [sys.executable, str(WRITER), "append", str(sc.workspace), "outbox", action.arg, "3"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert out.stdout.strip() == "done", out
        with ledger.lock:
            ledger.written += [f"w{action.arg}-{i:05d}" for i in range(3)]
    else:  # ack
        with ledger.lock:
            left = [i for i in ledger.written if i not in ledger.acked | ledger.maybe_acked]
            ids = ledger.rng.sample(left, min(action.arg, len(left)))
            if ids:
                ledger.maybe_acked |= set(ids)
        if not ids:
            return
        code, body = request(sc, "POST", "/outbox/ack", {"ids": ids})
        if code == 200:
            with ledger.lock:
                ledger.acked |= set(ids)
                ledger.maybe_acked -= set(ids)
        elif code is not None:
            ledger.bad_answers.append(f"POST /outbox/ack: {code} {body}")


def poll_status(sc: Sidecar, ledger: Ledger, stop: threading.Event) -> None:
    """/status throughout the run: any 5xx is recorded. Bounded in count and time."""
    deadline = time.monotonic() + 140
    while not stop.is_set() and ledger.status_polls < 3000 and time.monotonic() < deadline:
        code, body = request(sc, "GET", "/status")
        ledger.status_polls += 1
        if code is not None and code >= 500:
            ledger.bad_answers.append(f"GET /status: {code} {body}")
        stop.wait(0.1)


def watch_clis(sc: Sidecar, ledger: Ledger, stop: threading.Event) -> None:
    """The process table every 20 ms: two CLIs at once is recorded with their pids."""
    deadline = time.monotonic() + 140
    while not stop.is_set() and time.monotonic() < deadline:
        clis = census(sc).clis
        ledger.samples += 1
        if len(clis) > 1:
            ledger.two_clis.append(f"{[(p.pid, p.argv[1:]) for p in clis]}")
        stop.wait(0.02)


def make_sidecar(tmp: Path) -> Sidecar:
    stubborn = py_cli("stubborn.py", str(tmp / "stubborn.pids"), "fresh")["command"]
    config = write_cli_config(
        tmp / "clis.yaml",
        {
            "alpha": py_cli("pidfile.py", str(tmp / "alpha.pid")),
            "beta": py_cli("pidfile.py", str(tmp / "beta.pid")),
            "stubborn": {"command": stubborn, "resume": [*stubborn[:-1], "resumed"]},
        },
    )
    return Sidecar(
        tmp,
        cli="alpha",
        env_extra={
            "SIDECAR_CLI_CONFIG": str(config),
            "SIDECAR_RESTART": "always",
            "SIDECAR_STOP_GRACE": str(GRACE),
        },
    )


@contextlib.contextmanager
def explained(sc: Sidecar) -> Iterator[None]:
    """A failed assertion comes with the sidecar log's warnings and errors."""
    try:
        yield
    except AssertionError as exc:
        msg = f"{exc}\nsidecar log ({sc.log_path}), warnings and errors:\n{log_excerpt(sc)}"
        raise AssertionError(msg) from exc


def log_excerpt(sc: Sidecar, lines: int = 40) -> str:
    """The sidecar log's warnings and errors, last `lines` of them."""
    picked = []
    for line in sc.log().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            picked.append(line)
            continue
        if str(record.get("level")).lower() in ("warning", "error", "critical"):
            picked.append(f"{record.get('logger')}: {record.get('msg')}")
    return "\n".join(picked[-lines:])


def test_every_fault_heals(seed: int, short_tmp: Path) -> None:
    """The plan for `seed` (bursts of SIGKILLs, resleeves and message traffic), then the
    invariants: whole again within RECOVER_WITHIN after every burst; never two CLIs at once;
    /status never 5xx; every inbox message posted once is there once; acked outbox messages
    gone, the others kept; SIGTERM at the end exits 0 and leaves nothing of the sleeve. A
    sleeve that does not recover ends the bursts, and the other invariants are still checked:
    the failure lists every one that broke."""
    bursts = plan(seed)
    ledger = Ledger(seed, random.Random(seed + 1))
    sc = make_sidecar(short_tmp)
    stop = threading.Event()
    broken: list[str] = []

    @contextlib.contextmanager
    def invariant(name: str) -> Iterator[None]:
        try:
            yield
        except (AssertionError, OSError, subprocess.TimeoutExpired) as exc:
            broken.append(f"{name}: {exc}")

    try:
        sc.start()
        watchers = [
            threading.Thread(target=poll_status, args=(sc, ledger, stop), daemon=True),
            threading.Thread(target=watch_clis, args=(sc, ledger, stop), daemon=True),
        ]
        for t in watchers:
            t.start()
        with invariant("recovers"), ThreadPoolExecutor(max_workers=16) as pool:
            for n, burst in enumerate(bursts):
                ledger.note(f"burst {n}")
                for future in [pool.submit(act, sc, a, ledger) for a in burst]:
                    future.result(timeout=60)
                took = wait_whole(
                    sc, RECOVER_WITHIN, f"whole after burst {n}", frozenset(ledger.killed)
                )
                ledger.note(f"burst {n}: whole after {took:.2f}s")
        stop.set()
        for t in watchers:
            t.join(10)
        with invariant("answers"):
            assert ledger.status_polls > 0
            assert not ledger.bad_answers, ledger.bad_answers
        with invariant("one CLI"):
            assert ledger.samples > 0
            assert not ledger.two_clis, f"two CLIs at once: {ledger.two_clis[:5]}"
        with invariant("messages"):
            check_messages(sc, ledger)
        with invariant("stops"):
            stops(sc, ledger)
    finally:
        stop.set()
        sc.kill_everything()
    if broken:
        steps = "\n".join(f"  burst {n}: " + ", ".join(map(str, b)) for n, b in enumerate(bursts))
        pytest.fail(
            f"seed {seed}: {len(broken)} invariants broken "
            f"(replay: {SEED_ENV}={seed} pytest -p no:randomly {__file__})\n"
            + "\n".join(broken)
            + f"\nplan:\n{steps}\ndone:\n"
            + "\n".join(ledger.log[-40:])
            + f"\nsidecar log, warnings and errors:\n{log_excerpt(sc)}",
            pytrace=False,
        )


def stops(sc: Sidecar, ledger: Ledger) -> None:
    """SIGTERM to init: exit 0 within the grace and the rest of the shutdown (ttyd's 2 s at
    most), with no process of the sleeve left and nothing left for init to clean up."""
    assert sc.proc is not None
    began = time.monotonic()
    sc.proc.send_signal(signal.SIGTERM)
    code = sc.proc.wait(GRACE + 10)
    took = time.monotonic() - began
    ledger.note(f"SIGTERM: exit {code} after {took:.2f}s")
    assert code == 0
    left = census(sc)
    assert not (left.tmux or left.cli_procs or left.ttyds), left
    assert "stopped the processes left behind" not in sc.log()


def check_messages(sc: Sidecar, ledger: Ledger) -> None:
    """Every inbox message answered 201 is listed once; none is listed twice; acked outbox
    messages are gone, the ones never acked are all there (an ack that got no answer may have
    been done or not)."""
    code, inbox = sc.get("/inbox")
    assert code == 200, inbox
    listed = [(m["id"], m["content"].strip()) for m in inbox["messages"]]
    ids = [i for i, _ in listed]
    bodies = [b for _, b in listed]
    for content, ident in ledger.posted.items():
        if ident is not None:
            assert ids.count(ident) == 1, f"inbox message {ident} listed {ids.count(ident)} times"
            assert (ident, content) in listed
        assert bodies.count(content) <= 1, f"{content!r} listed {bodies.count(content)} times"
    assert set(bodies) <= set(ledger.posted), "inbox messages nobody posted"
    code, outbox = sc.get("/outbox")
    assert code == 200, outbox
    out = [m["id"] for m in outbox["messages"]]
    assert not set(out) & ledger.acked, "acked outbox messages still listed"
    for ident in ledger.written:
        expected = {0, 1} if ident in ledger.maybe_acked else {0} if ident in ledger.acked else {1}
        assert out.count(ident) in expected, f"outbox {ident} listed {out.count(ident)} times"
    assert set(out) <= set(ledger.written), "outbox messages nobody wrote"


def test_the_plan_is_the_seeds_alone() -> None:
    """A seed replays: the same plan every time, and another seed gives another."""
    assert [[str(a) for a in b] for b in plan(7)] == [[str(a) for a in b] for b in plan(7)]
    assert plan(7) != plan(8)
    for seed in range(50):
        bursts = plan(seed)
        for target, most in MAX_KILLS.items():
            assert sum(any(a.arg == target for a in b) for b in bursts) <= most
