"""report (docs/architecture.md)."""
