"""Prefect flows: thin wrappers that chain memx's pipeline stages (profile → augment → train →
search) as versioned artifacts in the artifact store. All logic lives in memx/."""
