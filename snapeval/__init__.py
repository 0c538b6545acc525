"""snapeval: long-context accuracy evaluation for KV-cache compression."""

__version__ = "0.1.0"
