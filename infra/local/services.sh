#!/usr/bin/env bash
# Local development services on loopback only: moto S3 (bucket created) + MLflow server
# (SQLite backend, artifacts in s3://$BUCKET/mlflow). Prints the variables to export; Ctrl-C stops both.
#
#   infra/local/services.sh                       # any free ports, temp dir for the MLflow DB
#   infra/local/services.sh --s3-port 9000 --mlflow-port 5000 --dir .memx/services
#
# In another shell, paste the printed `export ...` lines, then e.g. `memx artifacts ls`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
cd "$ROOT"
PYTHONPATH="$ROOT/tests${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m support.services "$@"
