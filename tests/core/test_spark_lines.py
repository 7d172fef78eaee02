"""The Spark lines headwater supports (``headwater.adapters.spark_lines``): which releases, what is refused, and the
dev script's installs of each line agreeing with them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import headwater
from headwater.adapters import spark_lines
from headwater.adapters.spark_lines import UnsupportedSpark
from headwater.capture import jar

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)

ROOT = Path(__file__).resolve().parents[2]


def test_each_release_of_a_line_is_that_line_and_others_are_refused_naming_the_supported():
    assert spark_lines.line_of("3.5.7").minor == "3.5" and spark_lines.line_of("3.5.0").scala == "2.12"
    assert spark_lines.line_of("4.2.0").minor == "4.2" and spark_lines.line_of("4.2.1-SNAPSHOT").scala == "2.13"
    for version in ("3.4.4", "4.3.0", "2.4.8", "5.0.0"):
        with pytest.raises(UnsupportedSpark, match=rf"supports Spark 3\.5\.x, 4\.2\.x; this is Spark {version}"):
            spark_lines.line_of(version)


def test_a_line_has_the_apis_of_its_own_minor_and_earlier_ones():
    old, new = spark_lines.line_of("3.5.7"), spark_lines.line_of("4.2.0")
    assert old.has("3.5") and not old.has("4.0")
    assert new.has("3.5") and new.has("4.0") and new.has("4.2") and not new.has("4.10")


def test_each_line_has_a_jar_of_its_scala_version():
    assert {line.jar: line.scala for line in spark_lines.LINES} == {"3.5": "2.12", "4": "2.13"}
    assert all(jar.jar_path(line).is_file() for line in spark_lines.LINES)


def test_the_dev_script_installs_each_lines_tested_release_the_default_first():
    script = (ROOT / "dev").read_text()
    releases = dict(re.findall(r"\[([\d.]+)\]=([\d.]+)", re.search(r"SPARK_RELEASES=\((.*)\)", script).group(1)))
    order = re.search(r"^LINES=\((.*)\)$", script, re.M).group(1).split()
    assert releases == {line.minor: line.tested for line in spark_lines.LINES}
    assert order[0] == spark_lines.DEFAULT.minor and sorted(order) == sorted(releases)


class SessionOfAnotherSpark:
    """A stand-in for a SparkSession of Spark 3.4, which no line serves (a fake, named as such: attach must refuse
    it before it touches a session, a broker or a JVM, and no Spark 3.4 is installed here)."""

    version = "3.4.4"

    def __getattr__(self, name):
        raise AssertionError(f"attach used the session ({name}) before refusing its Spark")


def test_attach_refuses_a_spark_of_no_line_before_doing_anything():
    with pytest.raises(UnsupportedSpark, match=r"3\.5\.x, 4\.2\.x; this is Spark 3\.4\.4"):
        headwater.attach(SessionOfAnotherSpark(), bootstrap="127.0.0.1:1")
