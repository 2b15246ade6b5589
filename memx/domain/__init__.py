"""domain (docs/architecture.md)."""
