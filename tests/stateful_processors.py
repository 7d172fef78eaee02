"""``transformWithStateInPandas`` processors of the tests: ``StatefulProcessor`` is PySpark 4's, so the tests of
every line import this module only where they run one."""

from __future__ import annotations

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor


class RunningCount(StatefulProcessor):
    """``running_count`` as a ``transformWithStateInPandas`` processor: the key's rows so far."""

    def init(self, handle):
        self.seen = handle.getValueState("seen", "n long")

    def handleInputRows(self, key, rows, timerValues):
        seen = self.seen.get()[0] if self.seen.exists() else 0
        for frame in rows:
            seen += len(frame)
        self.seen.update((seen,))
        yield pd.DataFrame({"k": [key[0]], "n": [seen]})

    def close(self):
        pass
