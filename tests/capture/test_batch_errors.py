"""What a failed batch says of each Java cause: its message's first line, or a Python worker's exception."""

import pytest

from headwater.capture.batch_errors import first_line

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)


def test_a_java_message_is_named_by_itsfirst_line():
    assert first_line("Job aborted due to stage failure: Task 0\nDriver stacktrace:\n\tat x") \
        == "Job aborted due to stage failure: Task 0"
    assert first_line("") == "" and first_line("  \n ") == ""


def test_a_python_workers_traceback_is_named_by_its_exception():
    # As Spark 3.5 gives a PythonException's message: the worker's whole traceback.
    traceback = ('Traceback (most recent call last):\n  File "worker.py", line 1, in main\n    process()\n'
                 'tests.capture.test_sinks.InjectedFault: after the write of batch 1\n\n')
    assert first_line(traceback) == "tests.capture.test_sinks.InjectedFault: after the write of batch 1"
