"""The black boxes' functions in the plan log: signed by capture, checked before the query tier runs one.

A black box's function is code (cloudpickle bytes PySpark put in the plan). The query tier
re-runs it to narrow lineage (``headwater.query.narrow``), so it runs only bytes it can
authenticate as capture's: an HMAC-SHA256, with a key capture and the query tier share
(``narrowing_key`` or ``narrowing_key_file``), over the query, the black box's node id and
the whole function record, schemas included. Nothing is ever unpickled that fails this.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path


class Unverified(ValueError):
    """A black box function the query tier will not run: unsigned, tampered with, or no key to check it."""


def key_of(config) -> bytes | None:
    """The shared key of ``config`` (``narrowing_key``, else the file ``narrowing_key_file`` names), or None."""
    if config.narrowing_key:
        return config.narrowing_key.encode()
    if config.narrowing_key_file:
        try:
            return Path(config.narrowing_key_file).read_bytes().strip() or None
        except OSError:
            return None
    return None


def _message(query: str, node_id: int, function: dict) -> bytes:
    return json.dumps({"query": query, "node_id": node_id, "function": function}, sort_keys=True,
                      separators=(",", ":")).encode()


def signed(query: str, node_id: int, function: dict | None, key: bytes | None) -> dict:
    """The log's record of a black box's function: the function (its bytes as base64) and its signature
    (None without a key, or without a Python function)."""
    if function is None:
        return {"function": None, "signature": None}
    logged = {**function, "command": base64.b64encode(function["command"]).decode()}
    signature = hmac.new(key, _message(query, node_id, logged), hashlib.sha256).hexdigest() if key else None
    return {"function": logged, "signature": signature}


def verified(query: str, node_id: int, record: dict, key: bytes | None) -> dict:
    """The function of a logged black box record, its bytes decoded, once its signature checks out."""
    function, signature = record.get("function"), record.get("signature")
    if function is None:
        raise Unverified("the black box runs no Python function capture could keep")
    if key is None:
        raise Unverified("no narrowing key here to check the function's signature (set narrowing_key or "
                         "narrowing_key_file, the same as capture's)")
    if not signature:
        raise Unverified("capture logged the function unsigned (it had no narrowing key)")
    expected = hmac.new(key, _message(query, node_id, function), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, str(signature)):
        raise Unverified("the function's signature does not match: it was not written by capture with this key "
                         "(tampered with, or another key)")
    return {**function, "command": base64.b64decode(function["command"])}
