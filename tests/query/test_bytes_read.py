"""A question reads only its sets' files and row groups: the bytes the CSProv backend reads, counted.

The bench workload goes into two shards and is compacted into a generation (small sets), more arrives
after; the store's filesystem is wrapped in one that counts the bytes read through it (an instrument of
this test's, around the real local filesystem). Once a client is open (the shards' recent ranges read
whole, as a warm query service holds them), each backward question must read a small part of the
generation, far less than the recursive baseline (RQ), which scans every edge file at every level, and
give the same answer.
"""

from __future__ import annotations

import io
import random
import uuid

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from bench.workload import lineage_messages
from headwater.indexer.compaction import compact
from headwater.query.parquet import CSProvBackend, RecursiveBackend
from headwater.store.generation import Generation
from headwater.store.tables import Location
from tests.indexer.test_compaction import write_shards


class CountingHandler(pafs.FileSystemHandler):
    """The local filesystem, counting the bytes read from files opened for random access."""

    def __init__(self):
        self.fs = pafs.LocalFileSystem()
        self.read = 0

    def __eq__(self, other):
        return isinstance(other, CountingHandler)

    def __ne__(self, other):
        return not self == other

    def get_type_name(self):
        return "counting"

    def normalize_path(self, path):
        return self.fs.normalize_path(path)

    def get_file_info(self, paths):
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.fs.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError("not here")

    def delete_file(self, path):
        self.fs.delete_file(path)

    def move(self, src, dest):
        self.fs.move(src, dest)

    def copy_file(self, src, dest):
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path):
        return self.fs.open_input_stream(path)

    def open_input_file(self, path):
        handler, file = self, self.fs.open_input_file(path)

        class Counted(io.RawIOBase):
            def readable(self):
                return True

            def seekable(self):
                return True

            def seek(self, offset, whence=0):
                return file.seek(offset, whence)

            def tell(self):
                return file.tell()

            def readinto(self, buffer):
                data = file.read(len(buffer))
                buffer[: len(data)] = data
                handler.read += len(data)
                return len(data)

        return pa.PythonFile(Counted(), mode="r")

    def open_output_stream(self, path, metadata):
        return self.fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path, metadata):
        return self.fs.open_append_stream(path, metadata=metadata)


@pytest.mark.spark
def test_a_question_reads_its_sets_row_groups_not_the_store(spark, stack_config, tmp_path, monkeypatch):
    topic = f"b{uuid.uuid4().hex[:6]}.edges"
    messages = list(lineage_messages(300_000, seed=12, edges_per_message=5000))
    produced = write_shards(tmp_path, topic, messages[:-2])
    compact(spark, tmp_path, topic, threshold=300, buckets=64)
    produced += write_shards(tmp_path, topic, messages[-2:])
    generation = Generation.current(tmp_path, topic)
    assert generation is not None and generation.snapshot.shard_files
    size = generation.size_bytes()

    counting = CountingHandler()
    local = Location.filesystem
    monkeypatch.setattr(Location, "filesystem",
                        lambda self: (pafs.PyFileSystem(counting), local(self)[1]))
    config = stack_config.with_overrides(store_dir=str(tmp_path), edges_topic=topic)
    outputs = sorted({dst for _, dst in produced} - {src for src, _ in produced})
    asked = random.Random(12).sample(outputs, 20)
    read = {}
    answers = {}
    for name, backend_class in (("csprov", CSProvBackend), ("rq", RecursiveBackend)):
        backend = backend_class(config)
        try:
            backend.backward(asked[0])  # a warm client: the files' footers read once
            counting.read = 0
            answers[name] = [sorted(x.rid for x in backend.backward(rid)) for rid in asked]
            read[name] = counting.read / len(asked)
        finally:
            backend.close()
    assert answers["csprov"] == answers["rq"] and any(answers["csprov"])
    # A question reads a few row groups of its sets' buckets: a small part of the generation, and of what RQ reads.
    assert read["csprov"] < size / 10, (read, size)
    assert read["csprov"] * 10 < read["rq"], (read, size)
