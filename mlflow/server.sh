#!/usr/bin/env bash
# Start a real MLflow tracking server (UI + REST API) over the store Forge's stages write to by default:
# runs/mlflow.db (sqlite) and runs/mlartifacts. Binds 127.0.0.1 unless MLFLOW_HOST says otherwise; never expose
# it unauthenticated (see mlflow/README.md for basic auth, Postgres and S3-compatible storage).
#
#   make mlflow                     # http://127.0.0.1:5000
#   MLFLOW_PORT=5001 make mlflow
set -euo pipefail

runs="$(mkdir -p "${FORGE_RUNS_DIR:-runs}" && cd "${FORGE_RUNS_DIR:-runs}" && pwd)"
host="${MLFLOW_HOST:-127.0.0.1}"
port="${MLFLOW_PORT:-5000}"
mkdir -p "$runs/mlartifacts"

echo "MLflow UI: http://$host:$port  (store: $runs/mlflow.db)"
echo "Stages log here when run with MLFLOW_TRACKING_URI=http://$host:$port, or to the same files without it."
exec mlflow server \
  --backend-store-uri "sqlite:///$runs/mlflow.db" \
  --artifacts-destination "$runs/mlartifacts" \
  --host "$host" --port "$port" "$@"
