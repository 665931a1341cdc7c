"""Reading the MLflow model registry: versions, the @production alias, a version's files downloaded and checked.

What the other registry modules share. A version's artifacts (the register stage's MLflow run, under `candidate/`):
  model/                     the HF model directory (weights, config, tokenizer files)
  gguf/model-<type>.gguf     the GGUF variants of runs/<run>/quantize/
  tokenizer/                 tokenizer.json, tokenizer_config.json, chat_template.jinja of runs/<run>/tokenizer/
  reports/eval.json          the eval report of that model (eval-sft, else eval-pretrain), plus report.md
  reports/eval-base.json     for a fine-tune, the eval report of the model it was fine-tuned from (eval-pretrain)
  reports/quantize.json      the quantization report, and quantize-manifest.json (the quantize stage's manifest:
                             the sha256 of the model it read and of every GGUF it wrote)
  lineage.json               what the run was made of (registry/register.py)
Tags on the version: forge.sha256.* (model, each GGUF, each report, lineage), forge.eval.* (the eval summary),
forge.run, forge.code_commit, and after each `forge promote` forge.gate.* (registry/promote.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from forge import ForgeError
from forge.config import ForgeConfig
from forge.hashing import sha256_problems
from forge.paths import runs_root
from forge.tracking import tracking_uri

ALIAS = "production"
CANDIDATE = "candidate"  # artifact path, in the register stage's run, of the files a version carries
MAX_TAG = 4900  # MLflow's model version tag values stop at 5000 characters
MISSING = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")  # MLflow's error codes for no such model/version/alias


class RegistryUnavailable(ForgeError):
    """MLflow itself failed (its server down or unreachable, a registry error): nothing was judged, no model refused."""


def unavailable(uri: str, doing: str, exc: Exception) -> RegistryUnavailable:
    """The error that says what Forge was doing, at which tracking URI, MLflow's own words and what to do."""
    return RegistryUnavailable(
        f"MLflow failed while {doing} (tracking URI {uri}): {exc}. Check that the MLflow server is running and "
        "reachable and that registry.tracking_uri names it, then run the same command again"
    )


@contextlib.contextmanager
def mlflow_errors(uri: str, doing: str) -> Iterator[None]:
    """Report an MLflow failure inside the block as RegistryUnavailable, not as a traceback or a verdict."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as exc:
        raise unavailable(uri, doing, exc) from None


def get_version(client, name: str, version: str | int | None):
    """`models:/NAME/VERSION`, the newest version when `version` is None; ForgeError when there is none,
    RegistryUnavailable when MLflow cannot say."""
    from mlflow.exceptions import MlflowException

    try:
        if version is None:
            versions = client.search_model_versions(f"name = '{name}'")
            if not versions:
                raise ForgeError(f"registered model {name!r} has no versions; run `forge register` first")
            return max(versions, key=lambda v: int(v.version))
        return client.get_model_version(name, str(version))
    except MlflowException as exc:
        if exc.error_code in MISSING:
            raise ForgeError(f"no version {version} of registered model {name!r} ({exc.error_code})") from None
        raise unavailable(client.tracking_uri, f"reading {name} version {version or '(the newest)'}", exc) from None


def production(client, name: str):
    """The version @production points at, or None (RegistryUnavailable when MLflow cannot say)."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, ALIAS)
    except MlflowException as exc:
        if exc.error_code in MISSING:
            return None
        raise unavailable(client.tracking_uri, f"reading {name}@{ALIAS}", exc) from None


def download_version(cfg: ForgeConfig, client, name: str, version: str, dst: Path, path: str = "") -> Path:
    """Download the artifacts of `models:/NAME/VERSION` (or one file of them, `path`) into dst; the local path.

    The version's location comes from our client: MLflow's own `models:/` resolution reads the process-wide
    registry URI, not the one passed in."""
    import mlflow.artifacts

    source = client.get_model_version_download_uri(name, str(version)).rstrip("/")
    local = mlflow.artifacts.download_artifacts(
        artifact_uri=f"{source}/{path}" if path else source, dst_path=str(dst), tracking_uri=tracking_uri(cfg)
    )
    return Path(local)


def try_download(cfg: ForgeConfig, client, name: str, version: str, path: str, dst: Path) -> Path | None:
    """download_version of one file, or None when the version does not carry it."""
    from mlflow.exceptions import MlflowException

    try:
        return download_version(cfg, client, name, version, dst, path)
    except (MlflowException, OSError):
        return None


def scratch() -> Path:
    """Where downloads are unpacked before they are checked: inside the runs root, so a rename lands them."""
    root = runs_root()
    root.mkdir(parents=True, exist_ok=True)
    return root


def sha256_tag(name: str) -> str:
    """The version tag holding the sha256 of a file of a version directory: `model` (the HF directory) or
    gguf/model-TYPE.gguf, as registration wrote them."""
    return "forge.sha256.model" if name == "model" else f"forge.sha256.gguf.{Path(name).stem.removeprefix('model-')}"


def recorded_files(tags: dict[str, Any]) -> list[str]:
    """The files of a version that registration recorded a sha256 for: model/ and every GGUF."""
    ggufs = sorted(k.removeprefix("forge.sha256.gguf.") for k in tags if k.startswith("forge.sha256.gguf."))
    return ["model"] + [f"gguf/model-{t}.gguf" for t in ggufs]


def verify_files(root: Path, names: list[str], tags: dict[str, Any], label: str) -> None:
    """Refuse (ForgeError) unless each of `names` under the version directory `root` has the sha256 its tag
    recorded at registration; `label` names the version (NAME vN) in the message."""
    problems = sha256_problems(root, {name: tags.get(sha256_tag(name)) for name in names})
    if problems:
        raise ForgeError(
            f"refusing to serve {label} from {root}: {'; '.join(problems)} against the sha256 the registry recorded "
            f"at registration; delete {root} and `forge serve` downloads the version again"
        )
