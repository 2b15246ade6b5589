"""planner (docs/architecture.md)."""
