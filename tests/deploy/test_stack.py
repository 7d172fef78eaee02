import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from neo4j import GraphDatabase
from neo4j.exceptions import AuthError

from headwater.adapters.graph import driver
from headwater.deploy import tools
from headwater.deploy.neo4j_server import Neo4jServer
from headwater.deploy.stack import Stack, StackError, free_port


def cli(home, *args):
    return subprocess.run([sys.executable, "-m", "headwater.cli", "--home", str(home), *args],
                          capture_output=True, text=True, timeout=180)


def test_status_reports_each_part_healthy_and_names_its_server(stack):
    statuses = {s.name: s for s in stack.status()}
    assert set(statuses) == {"broker", "graph", "query", "narrow"}
    assert statuses["narrow"].server == "headwater narrow --follow"
    assert all(s.running and s.healthy for s in statuses.values())
    assert statuses["broker"].server == f"Apache Kafka {tools.KAFKA_VERSION} (KRaft)"
    assert statuses["graph"].server == f"Neo4j {tools.NEO4J_VERSION} Community"
    # the server the graph part names is the one that answers on Bolt, with auth on
    config = stack.config()
    with driver(config) as d, d.session(database=config.graph_database) as s:
        [row] = s.run("CALL dbms.components() YIELD name, versions, edition RETURN name, versions, edition")
    assert (row["name"], row["versions"], row["edition"]) == ("Neo4j Kernel", [tools.NEO4J_VERSION], "community")
    with pytest.raises(AuthError), GraphDatabase.driver(config.graph_uri, auth=(config.graph_user, "wrong")) as d:
        d.verify_connectivity()


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
    assert json.loads(down.stdout)["stopped"] == ["narrow", "query", "graph", "broker"]
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
            # no service: the stores, asked in-process
            assert "is not in the lineage" in json.loads(asked.stderr)["error"]
        finally:
            local.down()


def test_without_maven_stack_up_says_what_fetches_kafka(tmp_path, monkeypatch):
    """Apache Kafka's jars come from Maven Central on first use: on a machine without ``mvn`` (a PATH that
    has none, and an empty tools cache) the stack says so, and leaves nothing running."""
    monkeypatch.setenv("HEADWATER_TOOLS", str(tmp_path / "tools"))
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(StackError, match=r"cannot start Apache Kafka: mvn .*: mvn is not on this machine"):
        Stack(tmp_path / "home", ports={"broker": free_port(), "bolt": free_port(), "graph_http": free_port()}).up()
    assert Stack(tmp_path / "home").down() == []


def test_without_maven_stack_up_says_what_fetches_neo4j_and_stops_the_broker(tmp_path, monkeypatch):
    """Neo4j's jars come from Maven Central on first use too: Kafka's already fetched, a PATH with Java but no
    ``mvn``, the stack says what would fetch Neo4j and leaves only the broker it started, which down stops."""
    cache = tmp_path / "tools"
    cache.mkdir()
    kafka = tools.kafka()
    (cache / kafka.name).symlink_to(kafka)
    only_java = tmp_path / "bin"
    only_java.mkdir()
    (only_java / "java").symlink_to(shutil.which("java"))
    monkeypatch.setenv("HEADWATER_TOOLS", str(cache))
    monkeypatch.setenv("PATH", str(only_java))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    local = Stack(tmp_path / "home", ports={"broker": free_port(), "bolt": free_port(), "graph_http": free_port()})
    try:
        with pytest.raises(StackError, match=r"cannot start Neo4j: mvn .*: mvn is not on this machine"):
            local.up()
    finally:
        assert local.down() == ["broker"]


def test_a_password_that_starts_with_a_dash_is_set_as_the_password(tmp_path):
    """The stack's generated password (``secrets.token_urlsafe``) starts with "-" one time in 64: Neo4j's admin
    tool takes it as the password, not as an option (it once failed, printing its usage)."""
    server = Neo4jServer(tmp_path / "graph", free_port(), free_port(), "-h-looks-like-an-option")
    server.prepare(tools.neo4j())
    assert (tmp_path / "graph" / "data" / "dbms" / "auth.ini").exists()


def test_the_graph_page_cache_is_the_environment_s_else_the_stack_s(tmp_path, monkeypatch):
    from headwater.deploy.neo4j_server import PAGE_CACHE, PAGE_CACHE_ENV

    monkeypatch.delenv(PAGE_CACHE_ENV, raising=False)
    assert Neo4jServer(tmp_path, 1, 2, "p" * 12).settings()["server.memory.pagecache.size"] == PAGE_CACHE == "512m"
    monkeypatch.setenv(PAGE_CACHE_ENV, "4g")
    assert Neo4jServer(tmp_path, 1, 2, "p" * 12).settings()["server.memory.pagecache.size"] == "4g"
