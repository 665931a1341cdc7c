#!/bin/sh
# The MLflow tracking server in compose.yaml. Default: the embedded store in the runs volume (sqlite
# /app/runs/mlflow.db, artifacts in /app/runs/mlartifacts), the same files `forge` writes without a server.
# Team profile (docker/team.env): Postgres when FORGE_DB_HOST is set, S3-compatible artifacts when
# MLFLOW_S3_ENDPOINT_URL is set; the server proxies artifacts, so clients never see the bucket credentials.
# Listens on $MLFLOW_HOST (0.0.0.0: the container's published port; tests/test_team_store.py runs it on 127.0.0.1).
set -eu
if [ -n "${FORGE_DB_HOST:-}" ]; then
    : "${FORGE_DB_PASSWORD:?set FORGE_DB_PASSWORD (the Postgres password) for the team profile}"
    backend="postgresql+psycopg://${FORGE_DB_USER:-mlflow}:${FORGE_DB_PASSWORD}@${FORGE_DB_HOST}:${FORGE_DB_PORT:-5432}/${FORGE_DB_NAME:-mlflow}"
else
    backend="sqlite:////app/runs/mlflow.db"
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
    mkdir -p /app/runs/mlartifacts
    artifacts="/app/runs/mlartifacts"
fi
echo "mlflow: backend ${backend%%://*}, artifacts ${artifacts}"
exec mlflow server --backend-store-uri "$backend" --artifacts-destination "$artifacts" \
    --host "${MLFLOW_HOST:-0.0.0.0}" --port "${MLFLOW_PORT:-5000}" \
    --allowed-hosts "${MLFLOW_ALLOWED_HOSTS:-mlflow,mlflow:*,localhost,localhost:*,127.0.0.1,127.0.0.1:*}" \
    "$@"
