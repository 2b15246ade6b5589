"""MemX: memory-aware automatic parallelism for heterogeneous GPU clusters.

The library has no import-time side effects; `memx.cli.app` is the command line, `flows/` wraps the
pipeline stages in Prefect.
"""

__version__ = "0.1.0"
