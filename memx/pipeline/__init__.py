"""pipeline (docs/architecture.md)."""
