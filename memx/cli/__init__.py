"""cli (docs/architecture.md)."""
