"""The pipeline (docs/architecture.md §Artifact store, §Versions and fingerprints, §Model registry):
steps.py (profile → augment → train → search as versioned artifacts), versioning.py (their versions),
training.py (training and the champion rule), local.py (the in-process runner and library entry points),
registry.py (MLflow), store/ (local folder or S3), events.py (cluster changes)."""
