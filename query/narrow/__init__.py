"""Exact lineage through Python black boxes, proven by re-running them (issue 24): ``narrower.py``."""
