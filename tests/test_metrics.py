"""GET /metrics against a live sidecar, read with Prometheus's own text parser
(prometheus_client.parser): every family parses, and the numbers follow what really happened."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Callable
from pathlib import Path

from sidecar.api import prometheus
from sidecar.core.contract import AGENT_STATES
from tests.harness import Sidecar, py_cli, wait_for, write_cli_config
from tests.metricstools import TOKEN, scrape, value

VIEW = "metrics-view-token-0123"


def test_metrics_need_a_token_and_take_the_view_token(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": TOKEN, "SIDECAR_VIEW_TOKEN": VIEW}).start()
    code, _ = sc.get("/metrics", headers={})
    assert code == 401
    samples = scrape(sc, VIEW)
    assert value(samples, "sidecar_cli_up") == 1
    # The content type a Prometheus server asks for by default.
    resp = sc.get("/metrics", headers={"Authorization": f"Bearer {VIEW}"})
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")


def test_metrics_follow_the_sleeve(make_sidecar: Callable[..., Sidecar], short_tmp: Path) -> None:
    config = write_cli_config(short_tmp / "clis.yaml", {"three": py_cli("exit_with.py", "3")})
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": TOKEN, "SIDECAR_CLI_CONFIG": str(config)}).start()
    first = scrape(sc)
    assert value(first, "sidecar_cli_state", state="running") == 1
    assert value(first, "sidecar_cli_state", state="exited") == 0
    assert value(first, "sidecar_ttyd_state", state="running") == 1
    # The shell's agent state comes from its output (activity): one state is 1, the rest 0.
    agent = {st: value(first, "sidecar_agent_state", state=st) for st in AGENT_STATES}
    assert sorted(agent.values()) == [0] * (len(AGENT_STATES) - 1) + [1]
    assert (
        sum(value(first, "sidecar_agent_state_seconds_total", state=st) for st in AGENT_STATES) > 0
    )
    assert value(first, "sidecar_info", sleeve_id="test-sleeve", cli="shell", version="0.1.0") == 1
    assert value(first, "sidecar_resleeve_duration_seconds_count") == 0
    assert value(first, "sidecar_inbox_messages") == 0
    assert value(first, "process_resident_memory_bytes") > 0

    # Two messages in, one resleeve to a CLI that exits with 3, an open /events stream.
    for n in range(2):
        code, _ = sc.post("/inbox", {"from": "envoy", "type": "task", "content": f"job {n}"})
        assert code == 201
    code, _ = sc.post("/resleeve", {"cli": "three"})
    assert code == 202
    sc.wait_status(lambda s: s["cli_state"] == "exited" and s["cli_exit_code"] == 3, "exit 3")
    stream = urllib.request.urlopen(
        urllib.request.Request(f"{sc.url}/events", headers={"Authorization": f"Bearer {TOKEN}"}),
        timeout=10,
    )
    try:
        stream.readline()  # the first heartbeat: subscribed
        # Once, unless tmux died meanwhile: tmux 3.3a's server now and then dies of a SIGSEGV
        # in its parser of pane output (the kernel log shows it during suite runs here), and the
        # heal starts the CLI again, which exits with 3 again. Under restart policy `no` nothing
        # else does.
        seen: list[str] = []

        def exit_counted() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            got = scrape(sc)
            exits = value(got, "sidecar_cli_exits_total", code="3")
            heals = value(got, "sidecar_tmux_heals_total")
            seen[:] = [f"{exits:g} exits with 3, {heals:g} tmux heals"]
            done = value(got, "sidecar_cli_state", state="exited") == 1
            return got if done and 1 <= exits <= 1 + heals else None

        after = wait_for(exit_counted, what=lambda: f"the exit counted ({seen})")
        assert value(after, "sidecar_events_clients") == 1
    finally:
        stream.close()
    assert value(after, "sidecar_cli_up") == 0
    assert value(after, "sidecar_agent_state", state="exited") == 1  # the CLI is not running
    assert value(after, "sidecar_cli_state", state="exited") == 1
    assert value(after, "sidecar_info", sleeve_id="test-sleeve", cli="three", version="0.1.0") == 1
    assert value(after, "sidecar_resleeve_duration_seconds_count") == 1
    assert 0 < value(after, "sidecar_resleeve_duration_seconds_sum") < 30
    assert value(after, "sidecar_inbox_messages") == 2
    # Requests by route and status class: the two 201s, and at least the scrapes before.
    assert (
        value(after, "sidecar_http_requests_total", route="/inbox", method="POST", code="2xx") == 2
    )
    assert (
        value(after, "sidecar_http_requests_total", route="/metrics", method="GET", code="2xx") >= 1
    )
    sc.get("/no-such-route")
    last = scrape(sc)
    assert (
        value(last, "sidecar_http_requests_total", route="unmatched", method="GET", code="4xx") == 1
    )


def test_label_values_are_escaped(make_sidecar: Callable[..., Sidecar]) -> None:
    """A sleeve name with a quote and a backslash (SLEEVE_NAME allows both) reads back as is."""
    name = 'we"ird\\name'
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": TOKEN, "SLEEVE_NAME": name}).start()
    samples = scrape(sc)
    assert value(samples, "sidecar_info", sleeve_id=name, cli="shell", version="0.1.0") == 1


def test_process_families_are_read_at_most_once_per_interval() -> None:
    """The process_* families are read again only PROCESS_EVERY after the last read (the
    read time is moved back rather than waited out): a descriptor opened meanwhile shows then."""
    families = prometheus._ProcessFamilies()
    first = families(1.0)
    names = [line.split("\n")[-1].split()[0] for line in first]
    assert names == [
        "process_cpu_seconds_total",
        "process_virtual_memory_bytes",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
        "process_open_fds",
        "process_max_fds",
    ]

    def open_fds(lines: list[str]) -> int:
        [line] = [x for x in lines if "\nprocess_open_fds " in x]
        return int(line.rsplit(" ", 1)[1])

    fd = os.open("/dev/null", os.O_RDONLY)
    try:
        assert families(1.0) is first  # within the interval: the same lines, nothing read
        families.at -= prometheus.PROCESS_EVERY
        assert open_fds(families(1.0)) == open_fds(first) + 1
    finally:
        os.close(fd)
