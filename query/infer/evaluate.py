"""Inference's use of the evaluator (``headwater.spark.evaluate``): expressions over a pandas frame's rows.

A frame is a pandas DataFrame whose columns are exprIds. ``evaluate`` hands the columns an
expression reads to the evaluator, numeric, boolean and text ones as Arrow arrays (its kernels
compute over them), others as Python values (NULL as ``None``, whatever pandas held it as: ``None``,
``NaN``, ``NA``), and gives its value back as a Series: a predicate's as pandas' nullable
``boolean`` (Kleene logic: ``NOT NULL`` is NULL, ``FALSE AND NULL`` is FALSE), and a row passes a
predicate only where it is TRUE (``holds``), as in Spark's Filter.

Decimals stay ``Decimal`` (exact, as Spark's are), dates ``datetime.date``. The batch ran, so
a division by zero is NULL (``exact=False``). What the evaluator does not model raises
``NotEvaluable``: inference keeps a flagged superset.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from headwater.spark import evaluate as ev
from headwater.spark.evaluate import Binding, NotEvaluable, generated, objects, value_key
from headwater.spark.expr import Expr, refs
from headwater.spark.semantics import missing

__all__ = ["Binding", "NotEvaluable", "distinct_values", "evaluate", "generated", "holds", "objects", "value_key"]


def evaluate(e: Expr, frame: pd.DataFrame, bind: Binding | None = None) -> pd.Series:
    """``e``'s value for each row of ``frame``, indexed as it is."""
    found = _evaluate(e, frame, bind)
    values = ev.as_objects(found, len(frame))
    if found.type == "boolean":
        return pd.Series(pd.array(values, dtype="boolean"), index=frame.index)
    return pd.Series(values, index=frame.index, dtype=object)


def holds(e: Expr, frame: pd.DataFrame, bind: Binding | None = None) -> np.ndarray:
    """Which rows ``e`` is TRUE for (NULL and FALSE rows do not pass)."""
    found = _evaluate(e, frame, bind)
    if found.arrow:
        return found.data.fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
    return np.fromiter((v is True for v in ev.as_objects(found, len(frame))), bool, len(frame))


def _evaluate(e: Expr, frame: pd.DataFrame, bind: Binding | None) -> ev.Value:
    columns = {expr_id: _values(frame[expr_id]) for expr_id in refs(e) if expr_id in frame.columns}
    return ev.evaluate(e, columns, len(frame), _plain(bind) if bind else None)


def _values(column: pd.Series):
    """A column as the evaluator takes it: a numeric, boolean or text column as Arrow (NaN, pandas' NULL of a float
    column, as NULL), so that Arrow kernels compute over it; any other (decimals, dates, structs…) as Python
    values, NULL as ``None``."""
    if column.dtype.kind in "biuf":
        return pa.array(column.to_numpy(), from_pandas=True)
    values = column.to_numpy(dtype=object)
    missing = column.isna().to_numpy(dtype=bool)
    present = np.flatnonzero(~missing)
    if len(present) and type(values[present[0]]) is str:
        try:
            text = pa.array(values, pa.string(), from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # not text throughout
            text = None
        if text is not None:
            return text
    if missing.any():
        values = values.copy()
        values[missing] = None
    return values


def _plain(bind: Binding) -> Binding:
    """``bind`` with pandas' and numpy's NULLs as ``None``."""
    params = {name: None if missing(v) or v is pd.NA else v for name, v in bind.params.items()}
    scalars = {sid: None if missing(v) or v is pd.NA else v for sid, v in bind.scalars.items()}
    return Binding(params, bind.sets, scalars)


def distinct_values(items: np.ndarray) -> tuple[np.ndarray, list]:
    """(each item's position among the distinct items, -1 for None and NaN; the distinct items).

    Python's equality decides what is distinct (1, 1.0 and Decimal('1') are one), which
    ``value_key`` agrees with; items that cannot be hashed stay each their own."""
    try:
        codes, distinct = pd.factorize(items)
        return codes, list(distinct)
    except TypeError:
        return np.arange(len(items)), list(items)
