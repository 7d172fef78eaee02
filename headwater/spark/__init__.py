"""Spark's semantics in one place, for every part of headwater that reads what Spark wrote.

- ``catalyst``: Catalyst's vocabulary: its plan classes by what headwater makes of them (the plan
  IR's kinds, relations, pass-through nodes, stateful black boxes), simple class names, join types.
- ``plan_json``: the plan decoder's reading of Spark's plan JSON (``toJSON()``) and of capture's
  records of it: exprIds, flat pre-order lists as trees, aliases and Expand's columns. Capture's
  plan IR (``headwater.core.plan``), inference and explain all read plans through it.
- ``expr``, ``operators``: the decoder's typed view for inference: expressions as ``Expr`` trees,
  an optimized plan as operators.
- ``table_files``: the twins of Spark's file readers: a static table's rows read from its files
  as Spark reads them.

Imports nothing itself: importing one module (as capture's driver and the CLI do, and they must
start fast) loads only what that module needs.
"""
