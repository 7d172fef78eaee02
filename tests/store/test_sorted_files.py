"""Point reads through row group statistics, against a brute-force filter of every row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from headwater.store.sorted_files import SortedFiles


def test_reads_exactly_the_rows_with_the_keys_asked_for(tmp_path):
    rng = np.random.default_rng(5)
    files, tables = [], []
    for i in range(3):
        keys = np.sort(rng.integers(-(1 << 62), 1 << 62, 5000))
        keys[100:140] = keys[100]  # a key spanning row groups
        table = pa.table({"key": keys, "value": rng.integers(0, 1000, len(keys))})
        path = tmp_path / f"f{i}.parquet"
        # Small row groups, and one file without statistics (every group may then hold any key).
        pq.write_table(table, path, row_group_size=300, write_statistics=i != 2)
        files.append(path)
        tables.append(table)
    everything = pa.concat_tables(tables)
    found = SortedFiles(files, "key")
    edges = [t["key"][i].as_py() for t in tables for i in range(0, t.num_rows, 300)]  # row groups' first keys
    edges += [t["key"][i - 1].as_py() for t in tables for i in range(300, t.num_rows, 300)]  # and last keys
    for attempt in range(60):
        some = edges if attempt == 0 else rng.choice(everything["key"].to_numpy(), rng.integers(1, 20)).tolist()
        wanted = some + rng.integers(-(1 << 62), 1 << 62, 3).tolist()  # and keys no file holds
        got = found.read(wanted)
        expected = everything.filter(pc.is_in(everything["key"], pa.array(wanted, pa.int64())))
        assert sorted(zip(*got.to_pydict().values())) == sorted(zip(*expected.to_pydict().values()))
        assert found.read(wanted, ["value"]).column_names == ["value"]
    assert found.read([]).num_rows == 0 and found.read([]).schema == everything.schema
    assert SortedFiles([], "key").read([1]).num_rows == 0
