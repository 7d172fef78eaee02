import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from headwater.cli import main as cli_main
from headwater.deploy import stack as stack_module
from headwater.deploy.stack import Stack, StackError, free_port


def cli(home, *args):
    return subprocess.run([sys.executable, "-m", "headwater.cli", "--home", str(home), *args],
                          capture_output=True, text=True, timeout=180)


def test_status_reports_each_part_healthy(stack):
    statuses = {s.name: s for s in stack.status()}
    assert set(statuses) == {"broker", "graph", "query"}
    assert all(s.running and s.healthy for s in statuses.values())


def test_second_up_is_harmless_and_keeps_the_same_processes(stack):
    before = {s.name: s.pid for s in stack.status()}
    after = {s.name: s.pid for s in stack.up()}
    assert before == after


def test_up_down_stops_exactly_what_it_started(tmp_path):
    ports = {"broker": free_port(), "bolt": free_port(), "graph_http": free_port(), "query": free_port()}
    home = tmp_path / "own"
    result = cli(home, "stack", "up", "--broker-port", str(ports["broker"]), "--bolt-port", str(ports["bolt"]),
                 "--http-port", str(ports["graph_http"]), "--query-port", str(ports["query"]))
    assert result.returncode == 0, result.stderr
    parts = [json.loads(line) for line in result.stdout.splitlines()]
    pids = [p["pid"] for p in parts]
    assert all(p["healthy"] for p in parts) and all(pids)
    assert cli(home, "stack", "status").returncode == 0

    down = cli(home, "stack", "down")
    assert down.returncode == 0
    assert json.loads(down.stdout)["stopped"] == ["query", "graph", "broker"]
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or b"zombie" in Path(f"/proc/{pid}/status").read_bytes()
    status = cli(home, "stack", "status")
    assert status.returncode == 1
    assert not any(json.loads(line)["running"] for line in status.stdout.splitlines())


def test_taken_port_gives_a_clear_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        local = Stack(tmp_path, ports={"broker": port, "bolt": free_port(), "graph_http": free_port()})
        with pytest.raises(StackError, match=f"port {port} on 127.0.0.1 is taken"):
            local.up()
    local.down()


def test_a_part_that_cannot_start_leaves_those_started_known_to_down(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        local = Stack(tmp_path, ports={"broker": free_port(), "bolt": port, "graph_http": free_port()})
        try:
            with pytest.raises(StackError, match=f"cannot start the graph: port {port}"):
                local.up()
            broker = {s.name: s for s in local.status()}["broker"]
            assert broker.running and broker.pid
        finally:
            assert local.down() == ["broker"]
    assert not Path(f"/proc/{broker.pid}").exists() or b"zombie" in Path(f"/proc/{broker.pid}/status").read_bytes()


def test_a_taken_query_port_leaves_the_stores_up_and_questions_in_process(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        said = []
        local = Stack(tmp_path, ports={"broker": free_port(), "bolt": free_port(), "graph_http": free_port(),
                                       "query": port}, say=said.append)
        try:
            statuses = {s.name: s for s in local.up()}
            assert statuses["broker"].healthy and statuses["graph"].healthy and not statuses["query"].running
            assert any(f"port {port} on 127.0.0.1 is taken" in line and "in-process" in line for line in said)
            asked = cli(tmp_path, "lineage", "backward", "--rid", "1")
            assert asked.returncode == 2 and asked.stdout == ""
            assert "is not in the lineage" in json.loads(asked.stderr)["error"]  # no service: the stores, asked in-process
        finally:
            local.down()


def test_without_the_local_extra_stack_up_says_to_install_it(tmp_path, monkeypatch):
    # A fake, named as such: an uninstalled wheel cannot be produced inside the test run.
    real = stack_module.importlib.util.find_spec
    for wheel in ("arcadedb_embedded",):
        monkeypatch.setattr(stack_module.importlib.util, "find_spec",
                            lambda name, wheel=wheel: None if name == wheel else real(name))
        with pytest.raises(StackError, match=r"pip install 'headwater\[local\]'"):
            Stack(tmp_path, ports={"broker": free_port(), "bolt": free_port(), "graph_http": free_port()}).up()
        assert not (tmp_path / "stack.json").exists()  # nothing was started
        result = CliRunner().invoke(cli_main, ["--home", str(tmp_path), "stack", "up", "--broker-port",
                                               str(free_port()), "--bolt-port", str(free_port())])
        assert result.exit_code == 2 and result.stdout == ""
        assert result.stderr.count("\n") == 1 and "pip install 'headwater[local]'" in json.loads(result.stderr)["error"]


def test_without_maven_stack_up_says_what_fetches_kafka(tmp_path, monkeypatch):
    """Apache Kafka's jars come from Maven Central on first use: on a machine without ``mvn`` (a PATH that
    has none, and an empty tools cache) the stack says so, and leaves nothing running."""
    monkeypatch.setenv("HEADWATER_TOOLS", str(tmp_path / "tools"))
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(StackError, match=r"cannot start Apache Kafka: mvn .*: mvn is not on this machine"):
        Stack(tmp_path / "home", ports={"broker": free_port(), "bolt": free_port(), "graph_http": free_port()}).up()
    assert Stack(tmp_path / "home").down() == []


def test_headwater_and_its_cli_import_no_wheel_of_the_local_extra():
    loaded = subprocess.run([sys.executable, "-c", "import sys, headwater, headwater.cli, headwater.deploy.stack; "
                             "print([m for m in sys.modules if m.startswith('arcadedb')])"],
                            capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "[]", loaded.stderr
