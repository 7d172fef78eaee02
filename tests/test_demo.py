"""The README's demo command, run as a user would, on a stack of its own."""

import json
import subprocess
import sys
import time

from headwater.deploy.stack import free_port


def test_demo_runs_end_to_end_in_under_three_minutes_and_prints_lineage(tmp_path):
    home = tmp_path / "home"

    def cli(*args, timeout=300):
        return subprocess.run([sys.executable, "-m", "headwater.cli", "--home", str(home), *args],
                              capture_output=True, text=True, timeout=timeout)

    up = cli("stack", "up", "--broker-port", str(free_port()), "--bolt-port", str(free_port()),
             "--http-port", str(free_port()), "--query-port", str(free_port()))
    assert up.returncode == 0, up.stderr
    try:
        started = time.monotonic()
        demo = cli("demo")
        elapsed = time.monotonic() - started
    finally:
        cli("stack", "down")
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert elapsed < 180, f"demo took {elapsed:.0f}s"
    out = demo.stdout
    assert "batch 0:" in out and "indexed" in out
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    answers = [x for x in lines if "summary" not in x]
    (summary,) = [x["summary"] for x in lines if "summary" in x]
    assert summary["complete"] and summary["records"] == len(answers)  # every batch on the way fully captured
    assert {a["dataset"].split(":")[0] for a in answers} == {"kafka", "customers"}
    assert all(a["payload"] and "error" not in a["payload"] for a in answers)
