"""The team registry (compose.yaml's `team` profile) without containers: the same server entrypoint
(docker/mlflow-server.sh) with docker/team.env's settings, on a real PostgreSQL server (Debian's postgresql, a
throwaway cluster) and a real S3-compatible endpoint (moto's server). A candidate is registered, promoted and
resolved through the tracking server alone: its rows must land in Postgres, its files in the bucket, and what
`serve` downloads back must hash to what was registered. The server requires a user (MLflow's basic-auth app): a
request without one, or with a wrong password, gets 401; and no process of the server carries a password on its
command line.

Needs PostgreSQL's server binaries (`apt-get install postgresql`; .ci/run installs them) and the dev extras.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import free_port, wait_for_mlflow
from test_registry import REPO, config, model_src, register  # noqa: F401 - fixture

from forge.hashing import sha256_file, sha256_tree
from registry import promote
from registry.serving import servable

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)

TEAM_ENV = dict(line.split("=", 1) for line in (REPO / "docker" / "team.env").read_text().splitlines() if "=" in line)
PASSWORD = "team-test-password"  # the shell's FORGE_DB_PASSWORD in a real deployment
ADMIN, ADMIN_PASSWORD = "admin", "mlflow-admin-test-password"  # the shell's FORGE_MLFLOW_PASSWORD
SERVER = ["sh", str(REPO / "docker" / "mlflow-server.sh")]
S3_KEYS = {"AWS_ACCESS_KEY_ID": "forge-test", "AWS_SECRET_ACCESS_KEY": "forge-test-secret",
           "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip


def postgres_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name)]
    if not found[-1]:
        pytest.fail(f"PostgreSQL's {name} is missing: apt-get install postgresql (.ci/run does)")
    return found[-1]


def as_postgres(cmd: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root; Debian's package creates the `postgres` user
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="module")
def postgres() -> Iterator[dict[str, str]]:
    """A throwaway cluster on a loopback port, password authentication, the team profile's user and database."""
    import psycopg

    root = Path(tempfile.mkdtemp(prefix="forge-pg-"))  # under /tmp: the postgres user must reach it
    data, pwfile = root / "data", root / "pw"
    pwfile.write_text(PASSWORD + "\n")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(pwfile, "postgres")
    user, port = TEAM_ENV["FORGE_DB_USER"], free_port()
    subprocess.run(as_postgres([postgres_bin("initdb"), "-D", str(data), "-U", user, "--auth=scram-sha-256",
                                f"--pwfile={pwfile}"]), check=True, capture_output=True)  # fmt: skip
    options = f"-p {port} -c listen_addresses=127.0.0.1 -k {root}"
    ctl = postgres_bin("pg_ctl")
    subprocess.run(as_postgres([ctl, "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "start"]),
                   check=True, capture_output=True)  # fmt: skip
    try:
        with psycopg.connect(host="127.0.0.1", port=port, user=user, password=PASSWORD, dbname="postgres",
                             autocommit=True) as conn:  # fmt: skip
            conn.execute(f'CREATE DATABASE "{TEAM_ENV["FORGE_DB_NAME"]}"')  # the postgres image makes it from env
        yield {"FORGE_DB_HOST": "127.0.0.1", "FORGE_DB_PORT": str(port), "FORGE_DB_USER": user,
               "FORGE_DB_NAME": TEAM_ENV["FORGE_DB_NAME"], "FORGE_DB_PASSWORD": PASSWORD}  # fmt: skip
    finally:
        subprocess.run(as_postgres([ctl, "-D", str(data), "-m", "fast", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """moto's S3-compatible server on a loopback port, empty (as MinIO starts); yields its endpoint."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def server_env(**extra: str) -> dict[str, str]:
    """What compose gives the mlflow service, without its stores; the venv's mlflow first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "FORGE_DB_"))}
    return env | {"MLFLOW_HOST": "127.0.0.1", "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD,
                  "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"} | extra  # fmt: skip


@pytest.fixture(scope="module")
def team_server(postgres, s3, tmp_path_factory) -> Iterator[tuple[str, int]]:
    """docker/mlflow-server.sh with the team settings; yields the tracking URL and the server's process id."""
    port, root = free_port(), tmp_path_factory.mktemp("team-server")
    env = server_env(**postgres, **S3_KEYS, MLFLOW_S3_ENDPOINT_URL=s3, MLFLOW_PORT=str(port), FORGE_RUNS_DIR=str(root),
                     FORGE_ARTIFACT_BUCKET=TEAM_ENV["FORGE_ARTIFACT_BUCKET"])  # fmt: skip
    log_path = root / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*SERVER, "--workers", "1"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        wait_for_mlflow(url, proc, log_path, timeout=180)  # the first start creates MLflow's tables in Postgres
        yield url, proc.pid
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
    text = log_path.read_text()
    assert "backend postgresql+psycopg, artifacts s3://" in text and "basic auth" in text
    assert PASSWORD not in text and ADMIN_PASSWORD not in text
    assert (root / "mlflow-auth.db").is_file()  # the users, in the runs volume


def status(url: str, auth: tuple[str, str] | None = None) -> int:
    """The HTTP status of a read through MLflow's REST API, as `auth` (user, password) or anonymously."""
    import base64
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{url}/api/2.0/mlflow/registered-models/search?max_results=1")
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.slow  # ~30-60 s: Postgres, the S3 endpoint and the server start, then a register and a download
def test_team_store_keeps_the_registry_in_postgres_and_the_files_in_s3(
    team_server,
    postgres,
    s3,
    model_src,  # noqa: F811 - a fixture
    isolated_runs,
    monkeypatch,
):
    import boto3
    import psutil
    import psycopg

    team_server, pid = team_server
    # no secret on the command line of the server or of any process it started (its workers, its job runner)
    server = psutil.Process(pid)
    for p in [server, *server.children(recursive=True)]:
        cmdline = " ".join(p.cmdline())
        assert PASSWORD not in cmdline and ADMIN_PASSWORD not in cmdline, cmdline
    # every request needs a user: none, or a wrong password, is refused; /health stays open for the healthcheck
    assert status(team_server) == 401 and status(team_server, (ADMIN, "not-the-password")) == 401
    assert status(team_server, (ADMIN, ADMIN_PASSWORD)) == 200

    # the client logs in from the environment (compose's MLFLOW_TRACKING_USERNAME / _PASSWORD) and has no bucket
    # credentials: artifacts go through the tracking server, which proxies them
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
    for key in S3_KEYS:
        monkeypatch.delenv(key, raising=False)
    name = "forge-team-test"
    version = register(team_server, isolated_runs, "team", name, model_src)
    cfg = config(team_server, "team", name)
    assert promote.promote(cfg, name, version).passed

    # the registry lives in Postgres: the version and its @production alias are rows there
    with psycopg.connect(host="127.0.0.1", port=int(postgres["FORGE_DB_PORT"]), user=postgres["FORGE_DB_USER"],
                         password=postgres["FORGE_DB_PASSWORD"], dbname=postgres["FORGE_DB_NAME"]) as conn:  # fmt: skip
        versions = conn.execute("SELECT version FROM model_versions WHERE name = %s", (name,)).fetchall()
        aliases = conn.execute(
            "SELECT alias, version FROM registered_model_aliases WHERE name = %s", (name,)
        ).fetchall()
    assert [str(v) for (v,) in versions] == [version]
    assert [(a, str(v)) for a, v in aliases] == [("production", version)]

    # the files live in the bucket, byte for byte
    bucket = boto3.client(
        "s3",
        endpoint_url=s3,
        aws_access_key_id=S3_KEYS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_KEYS["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )
    keys = [o["Key"] for page in bucket.get_paginator("list_objects_v2").paginate(
        Bucket=TEAM_ENV["FORGE_ARTIFACT_BUCKET"]) for o in page.get("Contents", [])]  # fmt: skip
    weights = [k for k in keys if k.endswith("model/model.safetensors")]
    assert len(weights) == 1, keys
    local = isolated_runs / "team" / "pretrain" / "model" / "model.safetensors"
    stored = bucket.get_object(Bucket=TEAM_ENV["FORGE_ARTIFACT_BUCKET"], Key=weights[0])["Body"].read()
    assert stored == local.read_bytes()
    assert any(k.endswith(".gguf") for k in keys), keys

    # serve's @production lookup downloads through the server what was registered
    served = servable(cfg, "model")[0].parent
    assert sha256_tree(served / "model") == sha256_tree(isolated_runs / "team" / "pretrain" / "model")
    for gguf in (isolated_runs / "team" / "quantize").glob("*.gguf"):
        assert sha256_file(served / "gguf" / gguf.name) == sha256_file(gguf)


def test_the_server_refuses_to_start_without_an_admin_password(tmp_path):
    env = server_env(FORGE_RUNS_DIR=str(tmp_path))
    del env["MLFLOW_AUTH_ADMIN_PASSWORD"]
    out = subprocess.run(SERVER, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "set MLFLOW_AUTH_ADMIN_PASSWORD" in out.stderr, out.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_compose_hands_the_admin_password_to_the_server_and_to_every_client():
    """compose.yaml's names for the credentials are the ones the server script and MLflow's client read."""
    from test_images import compose

    services = compose({"FORGE_MLFLOW_PASSWORD": ADMIN_PASSWORD})["services"]
    assert services["mlflow"]["environment"]["MLFLOW_AUTH_ADMIN_PASSWORD"] == ADMIN_PASSWORD
    for name in ("pipeline", "promote", "register", "serve", "serve-gpu"):
        env = services[name]["environment"]
        assert (env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"]) == (ADMIN, ADMIN_PASSWORD), name
