"""headwater: row-level data lineage for Spark Structured Streaming."""

__version__ = "0.1.0"


def attach(spark, config=None, **settings):
    """Prepare ``spark`` for tracing; see ``headwater.capture.attach``."""
    from headwater.capture import attach as _attach

    return _attach(spark, config, **settings)
