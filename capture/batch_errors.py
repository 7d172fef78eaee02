"""What the per-batch hook raises back to Spark's stream thread when a call into the JVM fails.

The hook is a Python ``foreachBatch`` function: an exception it raises reaches the stream thread as a
``py4j.Py4JException`` whose message is the Python traceback, and a ``Py4JJavaError`` prints the whole
Java stack trace into it. When the query is being stopped, Spark tells an interruption from a failure
by that message alone (``StreamExecution.isInterruptionException``): it searches it with the regex
``py4j.protocol.Py4JJavaError: An error occurred while calling((.|\\r\\n|\\r|\\n)*)(InterruptedException|…)``,
whose repeated alternation recurses once per character after the match starts. A message of some
thousands of characters there (any Java stack trace) overflows the thread's stack: the stream thread
dies of a ``StackOverflowError`` in ``java.util.regex`` instead of stopping (issue 45), and a real
failure's cause is lost the same way.

So the hook never lets a ``Py4JJavaError`` out as it is (``for_the_stream``): an interruption (the Java
cause is an ``InterruptedException`` or its kin, or the batch's job group was cancelled) becomes a
``BatchInterrupted`` whose message is the short text the regex recognises, so the query stops as
untraced; any other failure becomes a ``BatchFailed`` naming each Java cause's class and first line,
without that text, and its whole Java trace goes to headwater's log.
"""

from __future__ import annotations

import logging

from py4j.protocol import Py4JJavaError

log = logging.getLogger("headwater.capture")

# Spark's IO_EXCEPTION_NAMES and InterruptedException: the Java causes it takes for a stop.
INTERRUPTIONS = ("java.lang.InterruptedException", "java.io.InterruptedIOException",
                 "java.nio.channels.ClosedByInterruptException")
PY4J_ERROR = "py4j.protocol.Py4JJavaError: An error occurred while calling"  # where Spark's regex starts
MOST_CAUSES = 8
MOST_LINE = 300


class BatchInterrupted(Exception):
    """The batch's call into the JVM was interrupted: its query is stopping."""


class BatchFailed(Exception):
    """The batch's call into the JVM failed; the message names each Java cause (the trace is logged)."""


def for_the_stream(error: Py4JJavaError, job_group: str | None) -> Exception:
    """What to raise to the stream thread for ``error``, raised in the batch of job group ``job_group``."""
    call = str(error.errmsg).strip().removeprefix("An error occurred while calling").strip(" .")
    interrupted = BatchInterrupted(f"{PY4J_ERROR} {call}.\n: {INTERRUPTIONS[0]}")
    try:
        causes = _causes(error.java_exception)
    except Exception:  # the JVM does not answer this thread: it was interrupted
        return interrupted
    if any(name in INTERRUPTIONS for name, _ in causes) or _cancelled(causes, job_group):
        return interrupted
    log.error("a traced batch's call %s failed", call, exc_info=error)
    named = "\n".join(f"caused by {name}: {line}" for name, line in causes)
    return BatchFailed(f"the call {call} failed (the Java trace is in headwater's log)\n{named}")


def _causes(java_exception) -> list[tuple[str, str]]:
    """Each Java cause's class name and first line of message, outermost first."""
    causes: list[tuple[str, str]] = []
    while java_exception is not None and len(causes) < MOST_CAUSES:
        line = first_line(str(java_exception.getMessage() or ""))[:MOST_LINE]
        causes.append((java_exception.getClass().getName(), line.replace(PY4J_ERROR, "Py4JJavaError:")))
        java_exception = java_exception.getCause()
    return causes


def first_line(message: str) -> str:
    """What a Java exception's message says first: its first line, or for a Python worker's traceback (Spark 3.5
    gives one as the message of a ``PythonException``), its last line, the Python exception itself."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1] if lines[0].startswith("Traceback (most recent call last)") else lines[0]


def _cancelled(causes: list[tuple[str, str]], job_group: str | None) -> bool:
    """Whether the batch's job group was cancelled (``query.stop()`` cancels it), as Spark tells it."""
    if not job_group:
        return False
    return any("cancelled" in line and job_group in line for _, line in causes)
