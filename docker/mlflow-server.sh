#!/bin/sh
# The MLflow tracking server in compose.yaml, always behind MLflow's basic-auth app: every request but /health needs
# a user. The admin user is created at the first start from MLFLOW_AUTH_ADMIN_USERNAME (default admin) and
# MLFLOW_AUTH_ADMIN_PASSWORD (required, 12+ characters; later changes go through MLflow's update-password API);
# the users live in mlflow-auth.db in the runs volume. MLFLOW_FLASK_SERVER_SECRET_KEY (CSRF) is generated per start
# when unset.
# Stores. Default: the embedded store in the runs volume ($FORGE_RUNS_DIR, /app/runs: sqlite mlflow.db, artifacts in
# mlartifacts), the same files `forge` writes without a server. Team profile (docker/team.env): Postgres when
# FORGE_DB_HOST is set, its password handed to libpq as PGPASSWORD (never in the store URI, so never on a command
# line or in a log); S3-compatible artifacts when MLFLOW_S3_ENDPOINT_URL is set, proxied by the server, so clients
# never see the bucket credentials.
# Listens on $MLFLOW_HOST (0.0.0.0: the container's published port; tests/test_team_store.py runs it on 127.0.0.1).
set -eu
: "${MLFLOW_AUTH_ADMIN_PASSWORD:?set MLFLOW_AUTH_ADMIN_PASSWORD (compose: FORGE_MLFLOW_PASSWORD), the MLflow admin password}"
runs="$(mkdir -p "${FORGE_RUNS_DIR:-/app/runs}" && cd "${FORGE_RUNS_DIR:-/app/runs}" && pwd)"
if [ -n "${FORGE_DB_HOST:-}" ]; then
    : "${FORGE_DB_PASSWORD:?set FORGE_DB_PASSWORD (the Postgres password) for the team profile}"
    export PGPASSWORD="$FORGE_DB_PASSWORD"
    backend="postgresql+psycopg://${FORGE_DB_USER:-mlflow}@${FORGE_DB_HOST}:${FORGE_DB_PORT:-5432}/${FORGE_DB_NAME:-mlflow}"
else
    backend="sqlite:///${runs}/mlflow.db"
fi
if [ -n "${MLFLOW_S3_ENDPOINT_URL:-}" ]; then
    bucket="${FORGE_ARTIFACT_BUCKET:-forge-artifacts}"
    # Create the bucket on first start (MinIO starts empty), at the endpoint MLflow uses (boto3 itself does not read
    # MLFLOW_S3_ENDPOINT_URL and would ask AWS).
    python3 - "$bucket" <<'PY'
import os
import sys

import boto3
from botocore.exceptions import ClientError

s3 = boto3.client("s3", endpoint_url=os.environ["MLFLOW_S3_ENDPOINT_URL"],
                  region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
bucket = sys.argv[1]
try:
    s3.head_bucket(Bucket=bucket)
except ClientError:
    s3.create_bucket(Bucket=bucket)
    print(f"created bucket {bucket}")
PY
    artifacts="s3://${bucket}"
else
    mkdir -p "$runs/mlartifacts"
    artifacts="$runs/mlartifacts"
fi
# The basic-auth settings (mlflow/basic_auth.ini explains them), written per start: no secret in them.
if [ -z "${MLFLOW_AUTH_CONFIG_PATH:-}" ]; then
    MLFLOW_AUTH_CONFIG_PATH="$(mktemp)"
    export MLFLOW_AUTH_CONFIG_PATH
    cat > "$MLFLOW_AUTH_CONFIG_PATH" <<EOF
[mlflow]
default_permission = READ
database_uri = sqlite:///${runs}/mlflow-auth.db
admin_username = ${MLFLOW_AUTH_ADMIN_USERNAME:-admin}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
EOF
fi
# MLflow before 3.16.1 ignores MLFLOW_AUTH_ADMIN_PASSWORD and ships a default admin password (GHSA-gq3w-7jj3-x7gr).
# The basic-auth app's CSRF key: MLFLOW_FLASK_SERVER_SECRET_KEY, else a new one per start.
MLFLOW_FLASK_SERVER_SECRET_KEY="$(python3 - <<'PY'
import os
import secrets
import sys

import mlflow.environment_variables as env

if not hasattr(env, "MLFLOW_AUTH_ADMIN_PASSWORD"):
    sys.exit("mlflow-server.sh: this MLflow ignores MLFLOW_AUTH_ADMIN_PASSWORD: install mlflow[auth]>=3.16.1")
print(os.environ.get("MLFLOW_FLASK_SERVER_SECRET_KEY") or secrets.token_hex(32))
PY
)"
export MLFLOW_FLASK_SERVER_SECRET_KEY
echo "mlflow: backend ${backend%%://*}, artifacts ${artifacts}, basic auth (users in ${runs}/mlflow-auth.db)"
exec mlflow server --app-name basic-auth --backend-store-uri "$backend" --artifacts-destination "$artifacts" \
    --host "${MLFLOW_HOST:-0.0.0.0}" --port "${MLFLOW_PORT:-5000}" \
    --allowed-hosts "${MLFLOW_ALLOWED_HOSTS:-mlflow,mlflow:*,localhost,localhost:*,127.0.0.1,127.0.0.1:*}" \
    "$@"
