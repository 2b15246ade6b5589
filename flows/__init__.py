"""Prefect flows: thin wrappers over memx's pipeline steps (memx.pipeline.steps: profile → augment →
train → search, versioned artifacts in the store). Prefect adds tasks, retries and artifacts; all
logic — versions, reuse, which model plans — lives in memx/."""
