"""What Forge may serve: the files of `NAME@production`, downloaded once into runs/.registry/NAME/vN and checked
against the sha256 registration recorded every time they are about to be served.

    path, source = servable(cfg, "gguf/model-q4_k_m.gguf")   # forge serve, forge bundle
    path, source = servable(cfg, "model")                    # forge serve --backend vllm

Threat model: anyone with write access to MLflow can set the forge.gate.decision tag, append an audit event, move
@production, and upload files over a version's artifacts with forge.sha256.* tags to match. So before serving:
- @production must be where a passing `forge promote` (or `forge rollback`) left it, by the tag and the audit log
  (registry/audit.py): this refuses an alias moved by hand in the MLflow UI, nothing more;
- the gate (registry/gate.py) judges the version's downloaded evidence again, with the policy of the serving config
  (never one named in MLflow): a forged tag or audit event on a version whose evidence fails is refused, naming the
  failing check, and so is a version promoted under a laxer policy. The regression checks compared the version
  with the production of its promotion and are not judged again;
- with the gate key on this host, the record `forge promote` signed over the version's files (registry/signature.py)
  must verify: this refuses evidence altered after promotion even with its hash tags rewritten.
Not defeated: an attacker holding the gate key; without the key on this host, evidence fabricated or altered
consistently (the gate checks that evidence hangs together, not that it is true: an eval.json written to pass, its
hashes and tags to match); @production moved back to an older version that did pass, with a forged audit event (a
downgrade); deleted versions or tags (serving stops, nothing wrong is served).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from forge import ForgeError
from forge.config import ForgeConfig
from forge.paths import runs_root
from forge.tracking import client_for
from registry import gate
from registry.audit import audited_production
from registry.promote import read_evidence
from registry.signature import check_signature, version_files
from registry.store import ALIAS, download_version, recorded_files, scratch, verify_files


def servable(cfg: ForgeConfig, part: str) -> tuple[Path, dict[str, Any]]:
    """The file `part` of @production ("model", or "gguf/model-TYPE.gguf"), re-verified now, and where it comes from
    ({"name", "alias", "version"}): the one way serving gets a model from the registry."""
    name = cfg.registry.model_name
    root, mv = _production_dir(cfg, name)
    path = root / part
    if not path.exists():
        have = sorted(p.name for p in (root / "gguf").glob("*.gguf"))
        raise ForgeError(f"{name}@{ALIAS} has no {part} (serve.gguf_type={cfg.serve.gguf_type}); it has: {have}")
    # the cache was checked when it was downloaded; a file changed on disk since must not be served
    verify_files(root, [part], mv.tags, f"{name} v{mv.version}")
    judge_again(cfg, name, mv, root)
    return path, {"name": name, "alias": ALIAS, "version": str(mv.version)}


def _production_dir(cfg: ForgeConfig, name: str) -> tuple[Path, Any]:
    """The local copy of `models:/NAME@production` (model/, gguf/, tokenizer/, reports/, lineage.json) and its
    version. Refuses an alias that `forge promote`/`forge rollback` did not set, and a download whose files' sha256
    differ from what registration recorded."""
    client = client_for(cfg)
    prod, prod_v, stack, audited = audited_production(
        cfg, client, name, f"promote one with `forge promote {name} VERSION`"
    )
    if prod.tags.get("forge.gate.decision") != "pass" or not stack or stack[-1] != prod_v:
        raise ForgeError(
            f"refusing to serve {name}@{ALIAS} (v{prod_v}): it was not put there by a passing `forge promote` "
            f"(decision tag {prod.tags.get('forge.gate.decision')!r}, audit log says {audited}); promote a version "
            "through the gate"
        )
    dest = runs_root() / ".registry" / name / f"v{prod_v}"
    if not (dest / ".verified").is_file():
        with tempfile.TemporaryDirectory(prefix=".resolve-", dir=scratch()) as tmp:
            local = download_version(cfg, client, name, prod_v, Path(tmp))
            verify_files(local, recorded_files(prod.tags), prod.tags, f"{name} v{prod_v}")
            (local / ".verified").write_text(prod_v + "\n", encoding="utf-8")
            if dest.exists():
                shutil.rmtree(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(local, dest)
    return dest, prod


def judge_again(cfg: ForgeConfig, name: str, mv, root: Path) -> None:
    """Refuse (ForgeError) a version whose downloaded evidence does not pass the serving config's gate policy now,
    naming each failing check, or whose signed gate record does not verify (with the gate key on this host)."""
    evidence = read_evidence(root, mv.tags)  # no production_version: the regression checks are not judged again
    checks = gate.evaluate(gate.load_policy(cfg.registry.gate_policy), evidence)
    failing = [c for c in checks if not c.passed]
    if failing:
        raise ForgeError(
            f"refusing to serve {name} v{mv.version}: its evidence does not pass the gate policy "
            f"{cfg.registry.gate_policy} now, whatever its tags say: "
            + "; ".join(f"{c.name} ({c.detail})" for c in failing)
            + f"; promote a version that passes with `forge promote {name} VERSION`"
        )
    check_signature(name, str(mv.version), mv.tags, version_files(root, evidence))
