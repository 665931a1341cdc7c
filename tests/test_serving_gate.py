"""`forge serve` believes a version's evidence, not its tags: what someone with write access to MLflow (and no gate
key) can do, against a real `mlflow server` (conftest's mlflow_server) and test_registry's fabricated candidates.

- a version the gate refused, with the decision tag forged to "pass", an audit event appended and @production
  moved by hand: refused, naming the failing check;
- a version promoted under a laxer policy: refused under the serving config's policy; unsigned, refused by a
  serving host that holds the gate key;
- a passing version promoted with the key is served; once its eval.json is replaced in MLflow it is refused, by the
  gate while its hash tag is the old one, by the signature once the tag is rewritten to match.
"""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest
import yaml
from test_registry import POLICY, config, register, tiny_model_dir

from forge import ForgeError
from forge.hashing import sha256_file
from forge.io import utc_now
from registry import audit, promote, signature
from registry.serving import servable

KEY = "a-gate-key-of-the-promoting-host-0123456789abcdef"


@pytest.fixture(scope="module")
def model_src(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny-model") / "model")


@pytest.fixture
def no_key(monkeypatch, tmp_path):
    """No gate key on this host, whatever the developer's home holds."""
    for name in (signature.KEY_ENV, signature.KEY_FILE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(signature, "default_key_file", lambda: tmp_path / "no-gate-key")


def forge_promotion(cfg, name: str, version: str) -> None:
    """Everything `forge promote` leaves in MLflow, done by hand with the MLflow client."""
    from mlflow import MlflowClient

    client = MlflowClient(cfg.registry.tracking_uri)
    client.set_model_version_tag(name, version, "forge.gate.decision", "pass")
    client.set_model_version_tag(name, version, "forge.gate.failing", "none")
    event = {"action": "promote", "version": version, "previous": None, "failing": []}
    audit.append_event(cfg, client, name, event, utc_now(), "mallory")
    client.set_registered_model_alias(name, "production", version)


@pytest.mark.integration  # a real `mlflow server`
def test_a_forged_decision_tag_audit_event_and_alias_do_not_serve_failing_evidence(
    mlflow_server, isolated_runs, model_src, no_key
):
    name = "forge-test-forged-decision"
    version = register(mlflow_server, isolated_runs, "flagged", name, model_src, failing_flag="repetition")
    cfg = config(mlflow_server, "flagged", name)
    assert not promote.promote(cfg, name, version).passed
    forge_promotion(cfg, name, version)
    assert [e["action"] for e in audit.events(cfg)] == ["refuse", "promote"]  # the log now says it was promoted
    with pytest.raises(ForgeError, match="does not pass the gate policy") as refused:
        servable(cfg, "model")
    assert f"refusing to serve {name} v{version}" in str(refused.value)
    assert "red_flag:repetition (FAILED: repetition evidence)" in str(refused.value)


@pytest.mark.integration  # a real `mlflow server`
def test_a_version_promoted_under_a_laxer_policy_is_refused_by_the_serving_policy(
    mlflow_server, isolated_runs, model_src, no_key, tmp_path, monkeypatch
):
    lax = yaml.safe_load(POLICY.read_text())
    lax["quality"]["beats_floors"] = ["random_init"]  # the unigram floor dropped
    (tmp_path / "lax.yaml").write_text(yaml.safe_dump(lax))
    name = "forge-test-lax-policy"
    # bits per byte 6.0: below the random-init floor's 8.0, above the unigram floor's 5.0
    version = register(mlflow_server, isolated_runs, "weak", name, model_src, ppl=6.0)
    lax_cfg = config(mlflow_server, "weak", name, policy=tmp_path / "lax.yaml")
    assert promote.promote(lax_cfg, name, version).passed  # unsigned: no key on the promoting host

    with pytest.raises(ForgeError, match="does not pass the gate policy") as refused:
        servable(config(mlflow_server, "weak", name), "model")  # the shipped policy
    assert "quality:bits_per_byte<unigram" in str(refused.value)

    monkeypatch.setenv(signature.KEY_ENV, KEY)  # a serving host with the key accepts signed decisions only
    with pytest.raises(ForgeError, match="not signed with this host's gate key .* unsigned: no gate key"):
        servable(lax_cfg, "model")


@pytest.mark.integration  # a real `mlflow server`
def test_evidence_replaced_after_promotion_is_refused(mlflow_server, isolated_runs, model_src, no_key, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.setenv(signature.KEY_ENV, KEY)
    name = "forge-test-replaced-evidence"
    version = register(mlflow_server, isolated_runs, "good", name, model_src)
    cfg = config(mlflow_server, "good", name)
    assert promote.promote(cfg, name, version).passed
    client = MlflowClient(mlflow_server)
    mv = client.get_model_version(name, version)
    signed = json.loads(mv.tags[signature.RECORD_TAG])
    assert signed["decision"] == "pass" and {"model", "gguf/model-q4_k_m.gguf", "reports/eval.json"} <= set(
        signed["files"]
    )
    assert servable(cfg, "model")[1] == {"name": name, "alias": "production", "version": version}

    # The same version's eval.json replaced in MLflow (a harmless-looking edit), then served by a fresh host.
    report = json.loads((isolated_runs / "good" / "eval-pretrain" / "eval.json").read_text())
    report["note"] = "edited after promotion"
    edited = isolated_runs / "edited" / "eval.json"
    edited.parent.mkdir()
    edited.write_text(json.dumps(report))
    client.log_artifact(mv.run_id, str(edited), "candidate/reports")
    shutil.rmtree(isolated_runs / ".registry")
    with pytest.raises(ForgeError, match="does not pass the gate policy") as refused:
        servable(cfg, "model")
    assert "hash:evidence_files (changed or missing since registration: reports/eval.json)" in str(refused.value)

    # ...with its hash tag rewritten to match: the gate alone is satisfied, the signed record is not.
    client.set_model_version_tag(name, version, "forge.sha256.report.eval.json", sha256_file(edited))
    shutil.rmtree(isolated_runs / ".registry")
    with pytest.raises(ForgeError, match="differ from the ones `forge promote` judged and signed: reports/eval.json;"):
        servable(cfg, "model")
    monkeypatch.delenv(signature.KEY_ENV)
    assert servable(cfg, "model")[1]["version"] == version  # without the key, consistent edits pass (documented)


def test_the_gate_key_must_be_private_and_long(tmp_path, monkeypatch):
    monkeypatch.delenv(signature.KEY_ENV, raising=False)
    key = tmp_path / "gate-key"
    monkeypatch.setenv(signature.KEY_FILE_ENV, str(key))
    with pytest.raises(ForgeError, match="which is not a file: create it with"):
        signature.gate_key()
    key.write_text(KEY + "\n")
    os.chmod(key, 0o644)
    with pytest.raises(ForgeError, match=f"readable by others \\(mode 644\\): chmod 600 {key}"):
        signature.gate_key()
    os.chmod(key, stat.S_IRUSR | stat.S_IWUSR)
    assert signature.gate_key() == KEY.encode()
    monkeypatch.setenv(signature.KEY_ENV, "short")
    with pytest.raises(ForgeError, match="has 5 bytes, fewer than 32"):
        signature.gate_key()


def test_a_signed_record_verifies_only_for_its_own_version_decision_and_files(monkeypatch):
    monkeypatch.setenv(signature.KEY_ENV, KEY)
    files = {"model": "1" * 64, "reports/eval.json": "2" * 64}
    passed = signature.signature_tags("m", "3", True, "p" * 64, files)
    signature.check_signature("m", "3", passed, files)
    with pytest.raises(ForgeError, match="signed gate record says m v3"):
        signature.check_signature("m", "4", passed, files)  # a record copied onto another version
    refused = signature.signature_tags("m", "3", False, "p" * 64, files)
    with pytest.raises(ForgeError, match="decision 'fail'"):
        signature.check_signature("m", "3", refused, files)
    with pytest.raises(ForgeError, match="judged and signed: reports/eval.json, tokenizer/x;"):
        signature.check_signature("m", "3", passed, {**files, "reports/eval.json": "3" * 64, "tokenizer/x": "4" * 64})
    monkeypatch.setenv(signature.KEY_ENV, KEY[::-1])
    with pytest.raises(ForgeError, match="does not verify"):
        signature.check_signature("m", "3", passed, files)
