"""What Forge may serve: the files of `NAME@production`, downloaded once into runs/.registry/NAME/vN and checked
against the sha256 registration recorded every time they are about to be served.

    path, source = servable(cfg, "gguf/model-q4_k_m.gguf")   # forge serve, forge bundle
    path, source = servable(cfg, "model")                    # forge serve --backend vllm

@production counts only where a passing `forge promote` (or `forge rollback`) put it, as the audit log
(registry/audit.py) records: an alias moved by hand in the MLflow UI is refused.
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
from registry.audit import audited_production
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
