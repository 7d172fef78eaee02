"""A Python data source with a streaming writer, for the sink tests: each batch's rows go to
``<path>/<batch id>.jsonl`` at commit, and a batch id committed before is kept as it is;
``<path>/commits`` lists the batch id of every commit call."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage


@dataclass
class Rows(WriterCommitMessage):
    rows: list


class BatchFilesWriter(DataSourceStreamWriter):
    def __init__(self, path: str):
        self.path = path

    def write(self, iterator):
        return Rows([row.asDict() for row in iterator])

    def commit(self, messages, batchId):
        os.makedirs(self.path, exist_ok=True)
        with open(os.path.join(self.path, "commits"), "a") as calls:
            calls.write(f"{batchId}\n")
        target = os.path.join(self.path, f"{batchId}.jsonl")
        if os.path.exists(target):
            return
        with open(target + ".tmp", "w") as out:
            out.writelines(json.dumps(row) + "\n" for message in messages for row in message.rows)
        os.replace(target + ".tmp", target)

    def abort(self, messages, batchId):
        pass


class BatchFiles(DataSource):
    @classmethod
    def name(cls):
        return "hw_batch_files"

    def streamWriter(self, schema, overwrite):
        return BatchFilesWriter(self.options["path"])
