"""The gate's signed decision record: `forge promote` signs what it judged, `forge serve` checks the signature.

MLflow tags are writable by anyone who can write to MLflow, the forge.sha256.* tags that cover a version's files
included. So on a host that holds the gate key, `forge promote` tags each decision with a record of what it judged,
signed with HMAC-SHA256:

    forge.gate.record      {"format", "name", "version", "decision", "policy_sha256", "files": {path: sha256}}
    forge.gate.signature   hex HMAC-SHA256 of the record text under the gate key

`files` are measured on the downloaded version (model/ as a tree, every GGUF, report, tokenizer file and
lineage.json), never read from tags. Serving recomputes them and refuses a version whose record is missing, forged,
not "pass", or whose files differ (registry/serving.py holds the threat model).

The gate key: $FORGE_GATE_KEY, else the file $FORGE_GATE_KEY_FILE (default ~/.config/forge/gate-key), readable
only by its owner, 32 bytes or more. HMAC is symmetric: a host that verifies can also sign, so keep the key on the
promoting and serving hosts only, never on the MLflow server or in the runs volume.

    mkdir -p ~/.config/forge && (umask 077 && python -c 'import secrets; print(secrets.token_hex(32))' \\
        > ~/.config/forge/gate-key)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from pathlib import Path
from typing import Any

from forge import ForgeError
from forge.hashing import sha256_file
from registry.gate import Evidence
from registry.store import MAX_TAG

log = logging.getLogger("forge.registry")

KEY_ENV, KEY_FILE_ENV = "FORGE_GATE_KEY", "FORGE_GATE_KEY_FILE"
RECORD_TAG, SIGNATURE_TAG = "forge.gate.record", "forge.gate.signature"
RECORD_FORMAT = "forge-gate-record/1"
MIN_KEY_BYTES = 32
NEW_KEY = (
    "mkdir -p ~/.config/forge && (umask 077 && python -c 'import secrets; print(secrets.token_hex(32))' "
    "> ~/.config/forge/gate-key)"
)


def default_key_file() -> Path:
    return Path(os.environ.get(KEY_FILE_ENV) or Path.home() / ".config" / "forge" / "gate-key")


def gate_key() -> bytes | None:
    """The gate key, or None when this host has none. ForgeError for a key file others can read, a named key file
    that is missing, or a key too short to be a secret."""
    if os.environ.get(KEY_ENV):
        return _long_enough(os.environ[KEY_ENV].encode(), f"${KEY_ENV}")
    path = default_key_file()
    if not path.is_file():
        if os.environ.get(KEY_FILE_ENV):
            raise ForgeError(f"${KEY_FILE_ENV} names {path}, which is not a file: create it with {NEW_KEY}")
        return None
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ForgeError(f"the gate key {path} is readable by others (mode {mode:o}): chmod 600 {path}")
    return _long_enough(path.read_bytes().strip(), str(path))


def _long_enough(key: bytes, where: str) -> bytes:
    if len(key) < MIN_KEY_BYTES:
        raise ForgeError(f"the gate key in {where} has {len(key)} bytes, fewer than {MIN_KEY_BYTES}: {NEW_KEY}")
    return key


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def version_files(root: Path, ev: Evidence) -> dict[str, str]:
    """The sha256 of every file of a downloaded version directory: model/ as one tree and the GGUFs (both hashed
    already for the gate), every other file on its own. Dot files (serving's .verified marker) are not the
    version's."""
    files = {f"gguf/{name}": digest for name, digest in ev.gguf_sha256.items()}
    if ev.model_sha256:
        files["model"] = ev.model_sha256
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if path.is_file() and relative.parts[0] not in ("model", "gguf") and not path.name.startswith("."):
            files[relative.as_posix()] = sha256_file(path)
    return dict(sorted(files.items()))


def signature_tags(name: str, version: str, passed: bool, policy_sha256: str, files: dict[str, str]) -> dict[str, str]:
    """The record and signature tags of one decision, pass or fail (a refusal replaces an earlier pass); without a
    gate key, tags that say the decision is unsigned."""
    key = gate_key()
    if key is None:
        return {RECORD_TAG: "none", SIGNATURE_TAG: f"unsigned: no gate key on the promoting host (${KEY_ENV})"}
    record = {"format": RECORD_FORMAT, "name": name, "version": str(version), "decision": "pass" if passed else "fail",
              "policy_sha256": policy_sha256, "files": files}  # fmt: skip
    text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_TAG:
        raise ForgeError(f"{name} v{version} has too many files ({len(files)}) for a signed record in one MLflow tag")
    return {RECORD_TAG: text, SIGNATURE_TAG: _mac(key, text)}


def check_signature(name: str, version: str, tags: dict[str, Any], files: dict[str, str]) -> None:
    """Refuse (ForgeError) unless the version carries a record signed with this host's gate key, for this name and
    version, deciding "pass", over exactly `files`. Without a key on this host: a warning, nothing refused."""
    key = gate_key()
    label = f"{name} v{version}"
    if key is None:
        why = "its evidence is judged again, but nothing proves its files are the ones `forge promote` judged"
        log.warning("no gate key on this host ($%s or %s): %s is served; %s", KEY_ENV, default_key_file(), label, why)
        return
    text, signature = str(tags.get(RECORD_TAG) or ""), str(tags.get(SIGNATURE_TAG) or "")
    if not hmac.compare_digest(_mac(key, text), signature):
        state = signature if signature.startswith("unsigned") else "missing" if not signature else "does not verify"
        raise ForgeError(
            f"refusing to serve {label}: its gate decision is not signed with this host's gate key ({SIGNATURE_TAG}: "
            f"{state}); promote it with `forge promote {name} {version}` on a host holding the same key"
        )
    record = json.loads(text)
    if (record.get("name"), str(record.get("version")), record.get("decision")) != (name, str(version), "pass"):
        raise ForgeError(
            f"refusing to serve {label}: its signed gate record says {record.get('name')} v{record.get('version')}, "
            f"decision {record.get('decision')!r}; promote a version that passes with `forge promote {name} VERSION`"
        )
    signed = record.get("files") or {}
    changed = sorted(p for p in set(signed) | set(files) if signed.get(p) != files.get(p))
    if changed:
        raise ForgeError(
            f"refusing to serve {label}: these files differ from the ones `forge promote` judged and signed: "
            f"{', '.join(changed)}; changed since promotion, in MLflow or in the local copy: register and promote anew"
        )
