"""`forge data --executor ray` through the real CLI against the local executor on the same corpus: on a local Ray
instance of 2 CPUs, the same kept documents (ids, texts, splits) and the same drop reasons, word for word; on a
two-node cluster (ray.cluster_utils.Cluster, one CPU per node), the same output files byte for byte, with the
per-record passes' tasks run on both nodes.

The corpus is test_data_stage's dirty one (HTML, boilerplate, foreign languages, exact and near duplicates, a
val/train leak, unreadable files), padded with near-duplicate clusters so the banding has buckets of every size.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from test_data_stage import (
    SPLIT,
    build_dirty_corpus,
    edit_words,
    english_docs,
    english_sentences,
    read_removed,
    read_shards,
)

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)

REPO = Path(__file__).resolve().parent.parent


def forge_data(runs: Path, config: Path, *args: str, env: dict[str, str | None] | None = None
               ) -> subprocess.CompletedProcess:  # fmt: skip
    """`forge data` in a subprocess; `env` adds variables to this process's, or removes those it maps to None."""
    full = {**os.environ, "FORGE_RUNS_DIR": str(runs), "OMP_NUM_THREADS": "1", "RAY_DISABLE_USAGE_STATS": "1"}
    full.pop("RAY_ADDRESS", None)  # a local instance, never a cluster this machine happens to know
    for key, value in (env or {}).items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    return subprocess.run([sys.executable, "-m", "forge.cli", "data", "--config", str(config), *args],
                          env=full, cwd=REPO, capture_output=True, text=True, timeout=240)  # fmt: skip


def build_corpus(root: Path, filler: int = 0) -> dict[str, object]:
    """The dirty corpus, near-duplicate clusters of 1-4 copies, and `filler` distinct documents; what
    build_dirty_corpus expects of it."""
    expect = build_dirty_corpus(root)
    (root / "denied.txt").unlink()  # needs an in-process monkeypatch (root ignores chmod); not in a subprocess
    base = english_docs(40)[30:]
    for k, doc in enumerate(base):  # clusters of 1-4 near copies (J >= 0.8 with 1-2 edits of ~80 words)
        for c in range(k % 4):
            (root / f"cluster{k}_{c}.txt").write_text(edit_words(doc, edits=1 + c % 2))
        (root / f"cluster{k}.txt").write_text(doc)
    sentences, rng = english_sentences(), random.Random(0)
    for i in range(filler):  # 8 of ~335 sentences at random: two such documents share ~0.2 sentences
        picked = rng.sample(sentences, 8)
        (root / f"filler{i}.txt").write_text("\n".join(" ".join(picked[j : j + 2]) for j in range(0, 8, 2)))
    return expect


def write_config(path: Path, root: Path, tracking_uri: str | None = None) -> Path:
    registry = f"registry:\n  tracking_uri: {tracking_uri}\n" if tracking_uri else ""
    path.write_text(f"data:\n  inputs: [{json.dumps(str(root))}]\n  split: {json.dumps(SPLIT)}\n  min_eval_tokens: 0\n"
                    + registry)  # fmt: skip
    return path


@pytest.mark.slow  # ~45 s on 2 busy cores: Ray's start (~10 s) and two MLflow stores
def test_ray_executor_keeps_and_drops_exactly_what_the_local_one_does(tmp_path, isolated_runs):
    root = tmp_path / "corpus"
    expect = build_corpus(root)
    config = write_config(tmp_path / "run.yaml", root, "sqlite:///" + str(tmp_path / "mlflow.db"))

    results = {}
    for executor in ("local", "ray"):
        start = time.time()
        workers = "1" if executor == "local" else "2"  # local: inline, no pool start-up (the same output)
        proc = forge_data(isolated_runs, config, "--run", executor, "--executor", executor,
                          "--set", f"data.workers={workers}")  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = isolated_runs / executor / "data"
        kept = {i: (d["text"], d["split"]) for i, d in read_shards(out).items()}
        removed = {r["id"]: (r["filter"], r["reason"]) for r in read_removed(out)}
        report = json.loads((out / "report.json").read_text())
        results[executor] = kept, removed, report
        print(f"{executor}: {time.time() - start:.1f} s, {len(kept)} kept, {len(removed)} removed")
    assert "Ray local instance, 2 CPUs" in proc.stderr, proc.stderr[-2000:]

    (kept, removed, report), (ray_kept, ray_removed, ray_report) = results["local"], results["ray"]
    assert ray_kept == kept
    assert ray_removed == removed
    assert ray_report["duplicates"] == report["duplicates"] and ray_report["filters"] == report["filters"]
    # and the corpus exercised what it should: the dirty cases, and near-duplicate clusters found by banding
    assert set(expect["kept"]) <= set(kept)
    assert sum(f == "near_dedup" for f, _ in removed.values()) >= 10
    assert {f for f, _ in removed.values()} >= {"exact_dedup", "near_dedup", "decontamination", "language",
                                                "unreadable", "gopher_quality"}  # fmt: skip
    assert not (isolated_runs / "ray" / "data" / ".work").exists()


@pytest.fixture
def two_node_cluster(monkeypatch):
    """A head and a second node of one CPU each, as `ray start --head` and `ray start --address` would make them.
    Their sessions, sockets and the ray_current_cluster file live in a private RAY_TMPDIR (short: socket paths are
    capped at 107 characters), so a `ray.init()` elsewhere on this machine never finds this cluster."""
    from conftest import free_port

    temp = tempfile.mkdtemp(prefix="forge-ray-", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", temp)
    monkeypatch.setenv("RAY_DISABLE_USAGE_STATS", "1")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "dashboard_agent_listen_port": free_port()})  # fmt: skip
    try:
        cluster.add_node(num_cpus=1)
        yield cluster
    finally:
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow  # ~40 s on 2 busy cores: the cluster's start (~6 s), the local run (~10 s), the Ray one (~17 s)
def test_a_two_node_ray_cluster_writes_what_the_local_executor_writes_byte_for_byte(tmp_path, two_node_cluster):
    root = tmp_path / "corpus"
    expect = build_corpus(root, filler=1100)  # ~1,160 records a pass: 19 batches of 64, 3 blocks of 8 batches
    config = write_config(tmp_path / "run.yaml", root)
    address = two_node_cluster.address
    outputs, stderr = {}, ""
    for executor, args in (("local", ["--set", "data.workers=1"]), ("ray", ["--ray-address", address])):
        runs = tmp_path / f"runs-{executor}"  # one run name in both: report.json records it
        proc = forge_data(runs, config, "--run", "scale", "--executor", executor, *args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs[executor], stderr = runs / "scale" / "data", proc.stderr
    assert f"data: Ray {address}, 2 CPUs" in stderr, stderr[-2000:]

    local, ray = (json.loads((outputs[e] / "manifest.json").read_text()) for e in ("local", "ray"))
    for out, manifest in ((outputs["local"], local), (outputs["ray"], ray)):
        assert sha256_of_files(out) == manifest["outputs"]
    assert {"train-00000.parquet", "removed.jsonl.zst", "report.json", "calibration.png"} <= set(local["outputs"])
    config_files = local["outputs"].pop("config.yaml"), ray["outputs"].pop("config.yaml")
    assert ray["outputs"] == local["outputs"]  # every output file but the config, byte for byte
    assert ray["config_hash"] == local["config_hash"] and ray["metrics"] == local["metrics"]
    assert config_files[0] != config_files[1]  # it records the executor (data.workers, executor, ray_address)

    nodes = {two_node_cluster.head_node.node_id, *(n.node_id for n in two_node_cluster.worker_nodes)}
    ran = tasks_per_node(two_node_cluster, "_run_batches", until=lambda seen: set(seen) == nodes and seen.total() > 2)
    assert set(ran) == nodes, f"the per-record passes' tasks ran on {len(ran)} of the 2 nodes: {ran}"
    assert ran.total() > 2, f"one task for each of the 2 per-record passes: not split into blocks ({ran})"
    kept, report = read_shards(outputs["local"]), json.loads((outputs["local"] / "report.json").read_text())
    assert set(expect["kept"]) <= set(kept) and len(kept) > 1100  # the corpus exercised what it should
    assert report["filters"]["near_dedup"]["docs"] >= 10


@pytest.mark.slow  # ~15 s on 2 busy cores: the cluster's start (~8 s), a Ray worker per node importing Forge
def test_ray_tasks_on_two_nodes_encode_the_token_shards_the_local_encoder_does_byte_for_byte(
    tmp_path, two_node_cluster
):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from test_tokenizer import english_docs, write_data_stage

    from forge.config import TokenizerConfig, load_config
    from pretrain.token_shards import iter_text_batches, write_shards
    from pretrain.tokenizer import train_bpe

    splits = {"train": english_docs(600, seed=1), "val": english_docs(60, seed=2), "test": english_docs(30, seed=3)}
    write_data_stage(tmp_path, "enc", splits, shard_docs=50)  # 12 train shards, 2 val, 1 test
    shards = {split: sorted((tmp_path / "enc" / "data").glob(f"{split}-*.parquet")) for split in splits}
    tokenizer = train_bpe(iter_text_batches(shards["train"]), TokenizerConfig(vocab_size=700))
    ids = {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
    local = write_shards(tokenizer, shards, tmp_path / "local", ids, workers=1)

    nodes = {two_node_cluster.head_node.node_id, *(n.node_id for n in two_node_cluster.worker_nodes)}
    data = load_config(None, ["data.executor=ray", f"data.ray_address={two_node_cluster.address}"]).data
    ray.init(address=two_node_cluster.address, log_to_driver=False)  # the encoder joins this session
    try:
        # a worker up on each node first: a shard here takes ~0.05 s, less than a worker's start, so one node's
        # first worker would otherwise encode them all (on a real corpus a shard takes tens of seconds)
        warm = ray.remote(num_cpus=1)(lambda: __import__("pretrain.token_shards"))
        ray.get([warm.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
                 for node in nodes])  # fmt: skip
        on_ray = write_shards(tokenizer, shards, tmp_path / "ray", ids, data_cfg=data)
    finally:
        ray.shutdown()

    written = sha256_of_files(tmp_path / "local")
    assert sha256_of_files(tmp_path / "ray") == written and len(written) == 2 * 15 + 1  # .bin + .idx a shard, meta
    for split, stats in local.items():
        got = on_ray[split]
        assert (got.tokens, got.words, got.bytes) == (stats.tokens, stats.words, stats.bytes) and got.tokens > 0
        assert (got.token_counts == stats.token_counts).all() and (got.byte_counts == stats.byte_counts).all()
    ran = tasks_per_node(
        two_node_cluster, "encode_shard_task", until=lambda seen: set(seen) == nodes and seen.total() >= 15
    )
    print(f"encode_shard_task per node: {sorted(ran.values())}")  # pytest -s
    assert set(ran) == nodes and ran.total() >= 15, f"the 15 shards' tasks ran on {len(ran)} of the 2 nodes: {ran}"


def sha256_of_files(out: Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file() and p.name != "manifest.json"}  # fmt: skip


def tasks_per_node(cluster, task: str, until: Callable[[Counter[str]], bool], wait_s: float = 10.0) -> Counter[str]:
    """How many tasks named *task* each node's workers ran, from Ray's own record: the GCS task events (what
    ray.timeline reads; the ray.util.state API says the same but needs the dashboard, not in ray[data]). Workers
    report events every second: read again until `until` holds or wait_s has passed."""
    deadline = time.time() + wait_s
    while True:
        ran = Counter(event.state_updates.node_id.hex() for event in cluster.global_state._get_all_task_events()
                      if task in event.task_info.name and event.state_updates.node_id)  # fmt: skip
        if until(ran) or time.time() > deadline:
            return ran
        time.sleep(0.5)


def test_a_bad_executor_is_a_one_line_error_naming_the_field():
    from typer.testing import CliRunner

    from forge.cli import app

    result = CliRunner().invoke(app, ["data", "--executor", "spark"])
    assert result.exit_code == 2
    assert "data.executor" in result.output and "'local' or 'ray'" in result.output, result.output


def test_an_unreachable_ray_address_is_a_one_line_error(tmp_path):
    from typer.testing import CliRunner

    from forge.cli import app

    (tmp_path / "a.txt").write_text("one document")
    port = _closed_port()
    result = CliRunner().invoke(app, ["data", "--set", f"data.inputs=[{tmp_path / 'a.txt'}]", "--executor", "ray",
                                      "--ray-address", f"127.0.0.1:{port}"])  # fmt: skip
    assert result.exit_code == 2
    assert f"data.ray_address='127.0.0.1:{port}': nothing answers there" in result.output, result.output


@pytest.mark.slow  # ~40 s: the head's start (~6 s), Ray's own retries before it gives up (~20 s), one small run
def test_a_cluster_started_with_token_authentication_needs_it_turned_on_here_and_the_error_says_so(tmp_path):
    """The README's cluster path as a user takes it: `ray start --head` in one shell, `forge data --ray-address`
    in another. Ray turns token authentication on for a head that finds ~/.ray/auth_token (any local ray.init
    writes one) and the client must turn it on itself; Ray's error says only "failed to connect"."""
    import secrets

    from conftest import free_port

    home, port = tmp_path / "home", free_port()
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    temp = tempfile.mkdtemp(prefix="forge-ray-", dir="/tmp")  # short: Ray's socket paths are capped
    env = {"HOME": str(home), "RAY_TMPDIR": temp, "RAY_DISABLE_USAGE_STATS": "1"}
    head = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}, **env}
    ray = str(Path(sys.executable).with_name("ray"))
    started = subprocess.run([ray, "start", "--head", "--port", str(port), "--num-cpus", "1",
                              "--include-dashboard", "false", "--disable-usage-stats"],
                             env=head, capture_output=True, text=True, timeout=120)  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        root = tmp_path / "corpus"
        root.mkdir()
        for i, doc in enumerate(english_docs(6)):
            (root / f"{i}.txt").write_text(doc)
        config = write_config(tmp_path / "run.yaml", root)
        args = ("--executor", "ray", "--ray-address", f"127.0.0.1:{port}")
        unset = {**env, "RAY_AUTH_MODE": None}  # as a new shell has it (an earlier test's Ray may have set it here)
        refused = forge_data(tmp_path / "runs", config, *args, env=unset)
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert "cannot connect to Ray" in refused.stderr and "needs RAY_AUTH_MODE=token here" in refused.stderr
        # the fix the error names
        ran = forge_data(tmp_path / "runs", config, *args, env={**env, "RAY_AUTH_MODE": "token"})
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert f"data: Ray 127.0.0.1:{port}, 1 CPUs" in ran.stderr, ran.stderr[-2000:]
    finally:
        kill_processes_with_env(f"RAY_TMPDIR={temp}")  # this head only: `ray stop` stops every Ray on the machine
        shutil.rmtree(temp, ignore_errors=True)


def kill_processes_with_env(entry: str) -> None:
    """SIGKILL every process whose environment holds `entry`, and their descendants (the raylet starts its agents
    with an environment of its own, and they outlive it)."""
    needle, parents, chosen = b"\0" + entry.encode() + b"\0", {}, set()
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError):
            parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if needle in b"\0" + (proc / "environ").read_bytes():
                chosen.add(int(proc.name))
    while grown := {pid for pid, parent in parents.items() if parent in chosen} - chosen:
        chosen |= grown
    for pid in chosen:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _closed_port() -> int:
    from conftest import free_port

    return free_port()  # bound, then released: nothing listens there
