"""One reading of a lineage question (query/question.py): the CLI, the HTTP API and LineageClient refuse the same
questions in the same words, and take the same ones."""

from __future__ import annotations

import sys
from datetime import datetime, timezone

import pytest

from headwater.core.config import Config
from headwater.query import http
from headwater.query.api import LineageClient
from headwater.query.errors import LineageError
from headwater.query.question import CHECKS, MAX_DEPTH, MAX_PATHS, READS, Question, moment, time_window
from tests.cli.test_cli import error_of, invoke

# (CLI options, the same as a query string, as LineageClient.backward's keywords, the words every route refuses in)
REFUSED = [
    (["--depth", "0"], "depth=0", {"depth": 0}, "depth must be an integer from 1 to 64, not 0"),
    (["--depth", str(MAX_DEPTH + 1)], f"depth={MAX_DEPTH + 1}", {"depth": MAX_DEPTH + 1}, "depth must be"),
    (["--cols", "0"], "cols=0", {"cols": 0}, "cols is a non-zero 64-bit mask of columns"),
    (["--cols", str(1 << 63)], f"cols={1 << 63}", {"cols": 1 << 63}, "cols is a non-zero 64-bit mask"),
    (["--paths", str(MAX_PATHS + 1)], f"paths={MAX_PATHS + 1}", {"paths": MAX_PATHS + 1},
     "paths is how many paths to keep per row, 0 to 100"),
    (["--since", "yesterday"], "since=yesterday", {"since": "yesterday"},
     "since is an ISO 8601 time (e.g. 2026-11-23T18:00:00Z), not 'yesterday'"),
    (["--since", "2026-11-24T00:00:00Z", "--until", "2026-11-23T00:00:00Z"],
     "since=2026-11-24T00:00:00Z&until=2026-11-23T00:00:00Z",
     {"since": "2026-11-24T00:00:00Z", "until": "2026-11-23T00:00:00Z"}, "since (2026-11-24T00:00:00+00:00) is after"),
]


@pytest.fixture
def no_store(tmp_path):
    """A client whose stores are not there: a question refused before any store is asked never notices."""
    with LineageClient(Config().with_overrides(store_dir=str(tmp_path / "none"), graph_uri="bolt://127.0.0.1:9"),
                       backend="csprov") as client:
        yield client


@pytest.mark.parametrize("options, query, keywords, words", REFUSED)
def test_every_route_refuses_a_question_in_the_same_words(tmp_path, no_store, options, query, keywords, words):
    said = {"cli": error_of(invoke(tmp_path, "lineage", "backward", "--rid", "5", *options))["error"]}
    backward = next(r for r in http.ROUTES if r.method == "backward")
    with pytest.raises(LineageError) as refused:
        http.parse_query(backward, f"rid=5&{query}")
    said["http"] = str(refused.value)
    with pytest.raises(LineageError) as refused:
        no_store.backward(5, **keywords)
    said["api"] = str(refused.value)
    with pytest.raises(LineageError) as refused:
        Question("backward", 5, keywords)
    said["question"] = str(refused.value)
    assert all(words in found for found in said.values() if found is not None), said


def test_the_question_is_what_each_route_takes():
    assert Question("forward", -1, {"to": "output", "depth": 3, "cols": 0b101, "paths": 2}).options == \
        {"to": "output", "depth": 3, "cols": 5, "paths": 2}
    assert Question.read("backward", 7, {"depth": "4", "cols": "0b11", "payload": "true", "paths": "0"}).options == \
        {"depth": 4, "cols": 3, "payload": True, "paths": 0}
    assert Question("co_dependents", "kafka:t:0:5", {"via": "source", "depth": 1}).row == "kafka:t:0:5"
    assert Question("backward", 5, {"depth": None}).options == {}  # None: the method's default
    for direction, options, words in [
        ("sideways", {}, "a question is one of backward, forward"),
        ("co_contributors", {"cols": 1}, "co_contributors takes to, via, depth, payload, since, until, not cols"),
        ("backward", {"via": "x"}, "not via"),
        ("backward", {"to": ""}, "to is source, state, output"),
        ("backward", {"depth": True}, "depth must be"),
        ("backward", {"depth": 2.0}, "depth must be"),
    ]:
        with pytest.raises(LineageError, match=words):
            Question(direction, 5, options)
    for row in ("", True, 1 << 63, -(1 << 63) - 1, 2.5):
        with pytest.raises(LineageError):
            Question("backward", row)
    with pytest.raises(LineageError, match="parameter depth is empty"):
        Question.read("backward", 5, {"depth": ""})


def test_each_reading_ends_in_its_check():
    assert set(READS) == set(CHECKS)
    for text, value in [("1", 1), (str(MAX_DEPTH), MAX_DEPTH)]:
        assert READS["depth"](text) == CHECKS["depth"](value) == value
    for text in ("-0x8000000000000000", "0x7fffffffffffffff", "-1", "0b1"):
        assert READS["cols"](text) == CHECKS["cols"](int(text, 0))
    for text in ("1e3", " 1", "01x", "", "9" * 80, "0"):
        with pytest.raises(LineageError):
            READS["depth"](text)
    for text in ("1e3", "01x", "", "9" * 80, "0", "0x" + "f" * 16):
        with pytest.raises(LineageError):
            READS["cols"](text)
    with pytest.raises(LineageError, match="payload is true or false"):
        READS["payload"]("yes")


def test_time_bounds():
    assert moment("2026-11-23T18:00:00Z", "since") == datetime(2026, 11, 23, 18, tzinfo=timezone.utc)
    assert moment("2026-11-23T18:00:00", "since").tzinfo == timezone.utc  # naive: UTC
    assert moment(None, "since") is None
    assert time_window("2026-11-23", "2026-11-23") == (datetime(2026, 11, 23, tzinfo=timezone.utc),) * 2
    assert time_window(None, "2026-11-23")[0] is None


def test_the_cli_reads_a_question_without_the_query_tier(tmp_path):
    """The module the CLI reads a question with imports only the standard library and the query tier's errors."""
    import subprocess

    code = ("import sys; import headwater.query.question; "
            "print(sorted(m for m in sys.modules if m.startswith(('pyarrow', 'neo4j', 'kafka', 'headwater.query.'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "['headwater.query.errors', 'headwater.query.question']"
