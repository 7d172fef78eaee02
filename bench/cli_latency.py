"""The CLI's wall time on the demo stack, as a person or a script waits for it, process start to exit.

Starts a local stack on free ports in a fresh home, runs the demo into it (``headwater
demo``: 1,000 orders, the traced pipeline, the indexer), then times whole ``headwater``
processes, ``--runs`` of each after one uncounted warm-up:

- ``backward``: ``headwater lineage backward --rid R`` from the demo's sink row;
- ``forward``: ``headwater lineage forward --source kafka:TOPIC:PARTITION:OFFSET`` from a
  Kafka record that row derives from;
- ``where``: ``headwater lineage backward --dataset parquet:SINK --where "order_id IN (…)"``
  over the demo's sink (read and evaluated without Spark: ``query/where.py``).

Prints one JSON line: median and max seconds of each, the bars (``backward`` and
``forward`` 0.3 s, ``where`` 1 s, at the median), and ``passed``; exits 1 when a bar is
missed, after printing. ``demo_stack`` and ``wall_times`` are shared with
``tests/cli/test_cli.py``.

    .venv/bin/python bench/cli_latency.py [--runs 10] [--orders 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

BARS = {"backward": 0.3, "forward": 0.3, "where": 1.0}  # seconds, at the median


@dataclass(frozen=True)
class Demo:
    """The demo run into a stack: where its state is, and rows to ask about."""

    home: Path  # the stack's home: ``--home`` and ``HEADWATER_HOME`` of every command
    sink: str  # the demo's Parquet sink folder
    rid: int  # a sink row's _hw_rid
    order_id: int  # that row's order_id
    source: str  # a Kafka record that row derives from: kafka:TOPIC:PARTITION:OFFSET

    def env(self) -> dict[str, str]:
        """The environment of a ``headwater`` command on this stack: its store and spill in its home."""
        return {**os.environ, "HEADWATER_HOME": str(self.home)}

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "headwater.cli", "--home", str(self.home), *args]


@contextmanager
def demo_stack(home: Path | None = None, orders: int = 1000) -> Iterator[Demo]:
    """The demo run into the stack of ``home`` (running already: it is left running), or into a new
    stack on free ports in a fresh home, stopped afterwards. The demo runs in a child process, so
    its Spark session ends with it."""
    from headwater.deploy.stack import Stack, free_port

    with tempfile.TemporaryDirectory(prefix="cli-latency-") as tmp:
        own = home is None
        home = Path(tmp) / "home" if own else Path(home)
        stack = Stack(home, ports={"broker": free_port(), "bolt": free_port(), "graph_http": free_port()}) \
            if own else None
        try:
            if stack is not None:
                stack.up()  # a part that did not start: those that did are stopped below
            yield run_demo(home, orders)
        finally:
            if stack is not None:
                stack.down()


def run_demo(home: Path, orders: int) -> Demo:
    """``headwater.demo.run.run`` in a child process on the stack of ``home``; its result."""
    script = ("import dataclasses, json, sys; from pathlib import Path; from headwater.demo.run import run; "
              "r = run(Path(sys.argv[1]), orders=int(sys.argv[2]), say=lambda s: print(s, file=sys.stderr)); "
              "print(json.dumps(dataclasses.asdict(r)))")
    done = subprocess.run([sys.executable, "-c", script, str(home), str(orders)], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "HEADWATER_HOME": str(home)})
    if done.returncode != 0:
        raise RuntimeError(f"the demo failed ({done.returncode}): {done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    kafka = next(x for x in result["lineage"] if x["topic"])
    order_id = next(x for x in result["lineage"] if x["topic"])["payload"]["value"]["order_id"]
    return Demo(home, result["sink"], result["rid"], order_id,
                f"kafka:{kafka['topic']}:{kafka['partition']}:{kafka['offset']}")


def wall_times(command: list[str], runs: int, env: dict[str, str] | None = None) -> list[float]:
    """Seconds each of ``runs`` runs of ``command`` took, process start to exit, after one uncounted
    warm-up (the page cache). A run that fails fails the measure: a fast error is no answer."""
    times = []
    for i in range(runs + 1):
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        took = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command[3:])} failed ({done.returncode}): {done.stderr[-2000:]}")
        if i:
            times.append(took)
    return times


def measure(demo: Demo, runs: int) -> dict:
    """Each question's median and max seconds, against its bar."""
    questions = {
        "backward": demo.command("lineage", "backward", "--rid", str(demo.rid)),
        "forward": demo.command("lineage", "forward", "--source", demo.source),
        "where": demo.command("lineage", "backward", "--dataset", f"parquet:{demo.sink}", "--where",
                              f"order_id IN ({demo.order_id}, -1)"),
    }
    found = {}
    for name, command in questions.items():
        times = wall_times(command, runs, demo.env())
        found[name] = {"median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3),
                       "bar_s": BARS[name], "runs": runs}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--orders", type=int, default=1000)
    args = parser.parse_args()
    if args.runs < 10:
        parser.error("--runs: at least 10")
    with demo_stack(orders=args.orders) as demo:
        found = measure(demo, args.runs)
    missed = [name for name, x in found.items() if x["median_s"] > x["bar_s"]]
    print(json.dumps({"bench": "cli_latency", **found, "missed": missed, "passed": not missed}))
    if missed:
        said = ", ".join(f"{n} {found[n]['median_s']} s > {found[n]['bar_s']} s" for n in missed)
        print(f"bars missed (median): {said}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
