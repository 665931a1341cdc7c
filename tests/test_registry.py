"""The registry gate against a real `mlflow server` on a loopback port (conftest's mlflow_server), with fake-but-real
candidates: a tiny HF model directory (pretrain.model.build_model), GGUF-named files, and eval.json / quantize.json /
manifests in the schema the eval and quantize stages write."""

from __future__ import annotations

import itertools
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from evaluation.report import build_eval
from evaluation.text import SplitText
from forge import ForgeError
from forge.config import ForgeConfig, ModelConfig, load_config
from forge.hashing import sha256_file, sha256_tree
from registry import audit, gate, promote
from registry import register as register_stage
from registry.serving import servable

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)

REPO = Path(__file__).resolve().parent.parent
POLICY = REPO / "configs" / "policies" / "gate.yaml"
GGUF_TYPES = ("f16", "q8_0", "q4_k_m")


def tiny_model_dir(out: Path) -> Path:
    """A real, tiny HF Llama directory (a few KB of weights)."""
    import torch

    from pretrain.model import build_model

    torch.manual_seed(0)
    cfg = ModelConfig(hidden_size=16, num_layers=1, num_attention_heads=2, intermediate_size=32, context_length=16)
    build_model(cfg, vocab_size=64).save_pretrained(out)
    (out / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {}}}\n', encoding="utf-8")
    return out


def _manifest(stage_dir: Path, stage: str, inputs: dict[str, str] | None = None) -> None:
    outputs = {p.relative_to(stage_dir).as_posix(): sha256_file(p) for p in sorted(stage_dir.rglob("*")) if p.is_file()}
    manifest = {"stage": stage, "status": "complete", "config_hash": "0" * 64, "inputs": inputs or {},
                "outputs": outputs, "git_commit": None}  # fmt: skip
    (stage_dir / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def flag(name: str, passed: bool | None, evidence: str = "measured") -> dict[str, Any]:
    return {"name": name, "passed": passed, "value": 0.1, "threshold": 0.5, "evidence": evidence}


TEST_TEXT_SHA, QA_SHA = "6" * 64, "7" * 64  # what a fabricated eval measured (make_candidate's data and qa stages)
ITEMS = 200  # multiple-choice items, Q&A pairs and test documents of a fabricated eval


def eval_report(
    sha: str,
    *,
    ppl: float = 2.0,
    failing_flag: str | None = None,
    mc_acc: float = 0.5,
    qa_f1: float = 0.5,
    data: dict[str, str] | None = None,
    reference: tuple[str, float] | None = None,
) -> dict[str, Any]:
    """eval.json as evaluation/report.py builds it, with per-item evidence: ITEMS test documents of 100 bytes whose
    bits per byte average `ppl` (they vary by +-10% from document to document, the same way in every report), the
    first `mc_acc` share of ITEMS multiple-choice items right, Q&A pairs whose F1 averages `qa_f1`, and the
    reference model (sha256, bits per byte) when given, scored on the same documents."""
    flags = [flag(n, n != failing_flag, f"{n} evidence") for n in ("repetition", "memorisation", "incoherence",
                                                                   "untrained")]  # fmt: skip
    flags += [flag("ppl_drift", None, "no reference model"), flag("val_rise", None, "no history")]
    tokenizer = {"name": "PreTrainedTokenizerFast:model", "vocab_size": 4096, "sha256": "5" * 64}
    spread = [1 + 0.1 * math.sin(i) for i in range(ITEMS)]

    def result(p: float, acc: float, f1: float) -> dict[str, Any]:  # `p` sets bits per byte and per-token perplexity
        right = round(acc * ITEMS)
        mc = [{"id": f"mc{i}", "correct": i < right, "correct_norm": i < right, "correct_pmi": i < right}
              for i in range(ITEMS)]  # fmt: skip
        qa = [{"id": f"qa{i}", "f1": min(1.0, 2 * f1 * (i % 2)), "exact_match": 0.0} for i in range(ITEMS)]
        return {"text": {"bits_per_byte": p, "ppl": p, "tokens": 100, "tokenizer": tokenizer},
                "qa": {"qa_f1": f1, "qa_exact_match": 0.0, "qa_examples": ITEMS, "qa_empty_rate": 0.0},
                "mc": {"mc_acc": acc, "mc_acc_norm": acc, "mc_acc_pmi": acc, "mc_chance": 0.25, "mc_examples": ITEMS},
                "unigram": {"bits_per_byte": 5.0, "ppl": 50.0, "tokenizer": tokenizer,
                            "document_bits": [5.0 * 100 * s for s in spread]},
                "documents": {"index": list(range(ITEMS)), "bytes": [100] * ITEMS,
                              "bits": [p * 100 * s for s in spread]},
                "mc_predictions": mc, "qa_predictions": qa, "chat": False, "samples": []}  # fmt: skip

    ref = None
    if reference is not None:
        ref_result = result(reference[1], 0.0, 0.0)
        ref = ref_result["text"] | {"path": "base.gguf", "sha256": reference[0], "documents": ref_result["documents"]}
    return build_eval(
        target="runs/x/pretrain/model", artifact_kind="hf", sha256=sha, result=result(ppl, mc_acc, qa_f1),
        baseline=result(8.0, 0.25, 0.0), flags=flags, benchmarks=None,
        memorisation={"train": {"exact": 0.0}, "test": {"exact": 0.0}}, reference=ref,
        data={"test_text_sha256": TEST_TEXT_SHA, "test_shards": {}, "test_documents": ITEMS, "test_bytes": 100 * ITEMS,
              "qa_sha256": QA_SHA, "qa_source": "qa_eval.jsonl", **(data or {})},
        document_ids=[f"doc{i}" for i in range(ITEMS)],
    )  # fmt: skip


def quantize_report(model_dir: Path, drift_q4: float = 0.02) -> dict[str, Any]:
    artifacts: dict[str, Any] = {
        "hf-fp32": {"kind": "reference", "path": str(model_dir), "ppl": 20.0, "ppl_drift": 0.0}
    }
    for t, d in zip(GGUF_TYPES, (0.0, 0.001, drift_q4), strict=True):
        artifacts[t] = {"kind": "gguf", "path": f"model-{t}.gguf", "size_bytes": 4096, "ppl": 20.0 * (1 + d),
                        "ppl_drift": d, "ppl_drift_vs_f16": d}  # fmt: skip
    return {"model_dir": str(model_dir), "architecture": "llama", "artifacts": artifacts, "warnings": []}


def make_candidate(
    runs: Path,
    run: str,
    model_src: Path,
    *,
    ppl: float = 2.0,
    failing_flag: str | None = None,
    with_eval: bool = True,
    tamper_gguf: str | None = None,
    eval_data: dict[str, str] | None = None,
) -> Path:
    """runs/<run>/{data, qa, tokenizer, pretrain, eval-pretrain, quantize} as the stages leave them; `eval_data`
    overrides what the eval says it measured (another run's test text, say)."""
    root = runs / run
    (root / "data").mkdir(parents=True)
    for split in ("train", "val", "test"):
        (root / "data" / f"{split}-00000.parquet").write_bytes(f"{split} shard".encode())  # the same text in every run
    _manifest(root / "data", "data")
    (root / "qa").mkdir()
    (root / "qa" / "qa_eval.jsonl").write_text('{"question": "q", "answer": "a"}\n', encoding="utf-8")
    measured = {
        "test_text_sha256": SplitText(
            "test", [], {"test-00000.parquet": sha256_file(root / "data" / "test-00000.parquet")}
        ).sha256,
        "qa_sha256": sha256_file(root / "qa" / "qa_eval.jsonl"),
    }
    tok = root / "tokenizer"
    (tok / "shards").mkdir(parents=True)
    (tok / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {}}}\n', encoding="utf-8")
    (tok / "shards" / "train.bin").write_bytes(b"\x01\x00" * 64)
    _manifest(tok, "tokenizer")
    model = root / "pretrain" / "model"
    shutil.copytree(model_src, model)
    _manifest(root / "pretrain", "pretrain")
    sha = sha256_tree(model)
    if with_eval:
        (root / "eval-pretrain").mkdir()
        report = eval_report(sha, ppl=ppl, failing_flag=failing_flag, data=measured | (eval_data or {}))
        (root / "eval-pretrain" / "eval.json").write_text(json.dumps(report), encoding="utf-8")
        _manifest(root / "eval-pretrain", "eval-pretrain", {"model": sha})
    q = root / "quantize"
    q.mkdir()
    for i, t in enumerate(GGUF_TYPES):
        (q / f"model-{t}.gguf").write_bytes(b"GGUF" + bytes([3, 0, 0, 0, i]) * 800)
    (q / "quantize.json").write_text(json.dumps(quantize_report(model)), encoding="utf-8")
    _manifest(q, "quantize", {"model": sha})
    if tamper_gguf:  # changed after the quantize stage measured and hashed it
        with open(q / f"model-{tamper_gguf}.gguf", "ab") as fh:
            fh.write(b"\x00tampered")
    return root


def served_dir(cfg: ForgeConfig) -> Path:
    """The local copy of @production that `forge serve` reads its files from (model/, gguf/, tokenizer/, ...)."""
    return servable(cfg, "model")[0].parent


def config(server: str, run: str, model_name: str, policy: Path | None = None) -> ForgeConfig:
    return load_config(None, [
        f"run_name={run}", f"registry.tracking_uri={server}", f"registry.model_name={model_name}",
        f"registry.gate_policy={policy or POLICY}", "registry.experiment=forge-registry-tests",
    ])  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# tests against a real `mlflow server` on a loopback port (conftest's mlflow_server)

_names = itertools.count()


@pytest.fixture(scope="module")
def model_src(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny-model") / "model")


@pytest.fixture
def model_name(request):
    return f"forge-test-{request.node.name.removeprefix('test_')[:40]}-{next(_names)}"


def register(server: str, runs: Path, run: str, name: str, model_src: Path, **kw: Any) -> str:
    make_candidate(runs, run, model_src, **kw)
    manifest = register_stage.run(config(server, run, name))
    return str(int(manifest["metrics"]["version"]))


def test_passing_candidate_is_promoted_and_served(mlflow_server, isolated_runs, model_src, model_name):
    from mlflow import MlflowClient

    version = register(mlflow_server, isolated_runs, "good", model_name, model_src)
    cfg = config(mlflow_server, "good", model_name)
    with pytest.raises(ForgeError, match="no @production"):
        served_dir(cfg)  # nothing promoted yet: nothing is served, not even the newest version

    decision = promote.promote(cfg, model_name, version)
    assert decision.passed, decision.table()
    client = MlflowClient(mlflow_server)
    assert client.get_model_version_by_alias(model_name, "production").version == version
    tags = client.get_model_version(model_name, version).tags
    assert tags["forge.gate.decision"] == "pass" and tags["forge.gate.failing"] == "none"
    assert tags["forge.gate.policy_sha256"] == decision.policy_sha256 and tags["forge.gate.user"]
    assert tags["forge.sha256.model"] == sha256_tree(isolated_runs / "good" / "pretrain" / "model")
    assert set(GGUF_TYPES) <= {k.removeprefix("forge.sha256.gguf.") for k in tags}
    assert tags["forge.eval.verdict"] == "pass" and float(tags["forge.eval.bits_per_byte"]) == 2.0
    # every row of the decision table is a tag, with its interval and sample size
    assert tags["forge.gate.check.quality.mc_acc_pmi above chance"].startswith("pass 0.5 [0.4314, 0.5686] n=200")

    served = served_dir(cfg)
    assert sha256_tree(served / "model") == tags["forge.sha256.model"]
    assert sorted(p.name for p in (served / "gguf").iterdir()) == [f"model-{t}.gguf" for t in sorted(GGUF_TYPES)]
    assert (served / "tokenizer" / "tokenizer.json").is_file()
    lineage = json.loads((served / "lineage.json").read_text())
    assert "shards/train.bin" in lineage["data_shards"] and "tokenizer.json" in lineage["tokenizer"]
    assert lineage["config_sha256"] and "code_commit" in lineage
    assert lineage["evidence"]["qa_sha256"] == sha256_file(isolated_runs / "good" / "qa" / "qa_eval.jsonl")
    assert [e["action"] for e in audit.events(cfg)] == ["promote"]


def test_failing_red_flag_is_refused_by_the_cli_and_named(mlflow_server, isolated_runs, model_src, model_name):
    from forge.cli import app  # noqa: I001 - lazily: the CLI imports every verb
    from mlflow import MlflowClient

    make_candidate(isolated_runs, "flagged", model_src, failing_flag="repetition")
    common = ["--run", "flagged", "--set", f"registry.tracking_uri={mlflow_server}", "--set",
              "registry.experiment=forge-registry-tests", "--set", f"registry.model_name={model_name}"]  # fmt: skip
    registered = CliRunner().invoke(app, ["register", *common])
    assert registered.exit_code == 0, registered.output
    version = registered.output.strip().rsplit(" ", 1)[-1]
    args = ["promote", model_name, version, *common]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    line = next(ln for ln in result.output.splitlines() if ln.startswith("red_flag:repetition"))
    assert "FAIL" in line and "repetition evidence" in line
    assert "decision: FAIL (1 failing: red_flag:repetition)" in result.output
    client = MlflowClient(mlflow_server)
    tags = client.get_model_version(model_name, version).tags
    assert tags["forge.gate.decision"] == "fail" and tags["forge.gate.failing"] == "red_flag:repetition"
    assert "production" not in client.get_registered_model(model_name).aliases
    with pytest.raises(ForgeError, match="no @production"):
        served_dir(config(mlflow_server, "flagged", model_name))
    history = CliRunner().invoke(app, ["registry", "history", model_name, *args[3:]])
    assert history.exit_code == 0 and "refuse" in history.output and "red_flag:repetition" in history.output


def test_gguf_changed_after_evaluation_is_refused(mlflow_server, isolated_runs, model_src, model_name):
    version = register(mlflow_server, isolated_runs, "tampered", model_name, model_src, tamper_gguf="q4_k_m")
    decision = promote.promote(config(mlflow_server, "tampered", model_name), model_name, version)
    assert not decision.passed
    failing = [c for c in decision.checks if not c.passed]
    assert [c.name for c in failing] == ["hash:model-q4_k_m.gguf"]
    assert "changed after it was measured" in failing[0].detail


def test_version_without_eval_report_is_refused(mlflow_server, isolated_runs, model_src, model_name):
    version = register(mlflow_server, isolated_runs, "noeval", model_name, model_src, with_eval=False)
    decision = promote.promote(config(mlflow_server, "noeval", model_name), model_name, version)
    assert not decision.passed
    assert "evidence:eval_report" in gate.failing(decision.checks)


def test_regression_is_refused_and_rollback_restores_the_previous_production(
    mlflow_server, isolated_runs, model_src, model_name
):
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server)
    v1 = register(mlflow_server, isolated_runs, "r1", model_name, model_src, ppl=2.0)
    cfg = config(mlflow_server, "r1", model_name)
    assert promote.promote(cfg, model_name, v1).passed
    v2 = register(mlflow_server, isolated_runs, "r2", model_name, model_src, ppl=2.15)  # worse on every document
    worse = promote.promote(cfg, model_name, v2)
    assert gate.failing(worse.checks) == ["regression:bits_per_byte"]
    with pytest.raises(promote.GateRefused, match="regression:bits_per_byte"):  # the pipeline's promote step
        promote.promote_run(config(mlflow_server, "r2", model_name))
    assert client.get_model_version_by_alias(model_name, "production").version == v1
    v3 = register(mlflow_server, isolated_runs, "r3", model_name, model_src, ppl=1.9)  # better
    assert promote.promote(cfg, model_name, v3).passed
    assert client.get_model_version_by_alias(model_name, "production").version == v3

    moved = audit.rollback(cfg, model_name)
    assert (moved["previous"], moved["version"]) == (v3, v1)  # back past the refused v2, to the last that passed
    assert client.get_model_version_by_alias(model_name, "production").version == v1
    assert served_dir(cfg).name == f"v{v1}"
    assert [(e["action"], e["version"]) for e in audit.events(cfg)] == [
        ("promote", v1), ("refuse", v2), ("refuse", v2), ("promote", v3), ("rollback", v1)]  # fmt: skip
    periods = audit.history(cfg)
    assert [p["version"] for p in periods] == [v1, v3, v1] and periods[-1]["until"] is None
    with pytest.raises(ForgeError, match="no earlier version"):
        audit.rollback(cfg, model_name)

    # Someone moves the alias by hand (open-source MLflow cannot stop it): Forge refuses to serve it.
    client.set_registered_model_alias(model_name, "production", v2)
    with pytest.raises(ForgeError, match="not put there by a passing"):
        served_dir(cfg)


def test_embedded_store_registers_promotes_and_serves(isolated_runs, model_src):
    """No server: the default sqlite store under the runs directory, with local artifacts (version ids are ints)."""
    make_candidate(isolated_runs, "embedded", model_src)
    cfg = load_config(None, ["run_name=embedded", f"registry.gate_policy={POLICY}"])
    assert register_stage.run(cfg)["metrics"]["version"] == 1.0
    assert promote.promote_run(cfg)["version"] == "1"
    served = served_dir(cfg)
    assert served == isolated_runs / ".registry" / "forge-model" / "v1" and (served / "model" / "config.json").is_file()
    assert (isolated_runs / "mlflow.db").is_file()


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium; .ci/run)")
def test_mlflow_ui_shows_versions_aliases_tags_and_eval_metrics(
    mlflow_server, isolated_runs, model_src, model_name, tmp_path
):
    """Screenshots of the MLflow UI in headless Chromium: the model's versions with @production, the version's gate
    tags, and the eval metrics on the version's source run. $FORGE_UI_SCREENSHOTS keeps them in a directory."""
    import os

    from playwright.sync_api import sync_playwright

    from mlflow import MlflowClient

    v1 = register(mlflow_server, isolated_runs, "ui-good", model_name, model_src)
    v2 = register(mlflow_server, isolated_runs, "ui-flagged", model_name, model_src, failing_flag="repetition")
    cfg = config(mlflow_server, "ui-good", model_name)
    assert promote.promote(cfg, model_name, v1).passed and not promote.promote(cfg, model_name, v2).passed
    mv = MlflowClient(mlflow_server).get_model_version(model_name, v1)
    run = MlflowClient(mlflow_server).get_run(mv.run_id)
    out = Path(os.environ.get("FORGE_UI_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    pages = [
        (f"#/models/{model_name}", [f"Version {v1}", f"Version {v2}"], "registry-versions.png"),
        (
            f"#/models/{model_name}/versions/{v1}",
            ["production", "forge.gate.decision", "forge.sha256.model"],
            "registry-version.png",
        ),
        (
            f"#/experiments/{run.info.experiment_id}/runs/{mv.run_id}",
            ["eval.bits_per_byte"],
            "registry-run-metrics.png",
        ),
    ]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            for fragment, texts, name in pages:
                page.goto(f"{mlflow_server}/{fragment}", wait_until="domcontentloaded")
                for text in texts:
                    page.get_by_text(text).first.wait_for(state="visible", timeout=90_000)
                page.screenshot(path=str(out / name), full_page=True)
                assert (out / name).stat().st_size > 10_000
        finally:
            browser.close()
