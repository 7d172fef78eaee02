"""The tools cache (headwater.deploy.tools): one fetch however many processes ask at once, and
nothing half-fetched left behind."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from headwater.deploy import tools


def slow_fetch(into: Path) -> None:
    """Counts itself in a file beside the cache, and takes long enough for every caller to be waiting."""
    with open(into.parent / "fetches", "a") as counted:
        counted.write("1")
    time.sleep(0.5)
    (into / "tool").write_text("ok")


def ask(cache: str, answers) -> None:
    import os

    os.environ["HEADWATER_TOOLS"] = cache
    answers.put(str(tools.cached("slow", slow_fetch) / "tool"))


def test_concurrent_processes_fetch_a_tool_once(tmp_path):
    context = multiprocessing.get_context("spawn")  # a fresh interpreter, as a second pytest process is
    answers = context.Queue()
    processes = [context.Process(target=ask, args=(str(tmp_path), answers)) for _ in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    paths = {answers.get(timeout=10) for _ in processes}
    assert paths == {str(tmp_path / "slow" / "tool")} and Path(paths.pop()).read_text() == "ok"
    assert (tmp_path / "fetches").read_text() == "1"


def test_a_failed_fetch_leaves_nothing_and_the_next_call_fetches_again(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADWATER_TOOLS", str(tmp_path))

    def broken(into: Path) -> None:
        (into / "half").write_text("")
        raise tools.ToolUnavailable("the registry said no")

    with pytest.raises(tools.ToolUnavailable, match="said no"):
        tools.cached("flaky", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flaky.lock"]
    assert (tools.cached("flaky", lambda into: (into / "tool").write_text("ok")) / "tool").read_text() == "ok"


def test_a_tool_is_asked_for_by_a_known_name():
    with pytest.raises(KeyError) as refused:
        tools.path("promtol")
    assert all(name in str(refused.value) for name in tools.TOOLS)
