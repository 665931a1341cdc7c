"""Training checkpoints: everything a resumed run needs to continue as if it had never stopped.

Layout of one checkpoint, `runs/<run>/pretrain/checkpoints/step-NNNNNNN/`, written to a hidden temp directory
and renamed into place, so a checkpoint directory is either complete or absent (a SIGKILL mid-write leaves only a
`.step-*.tmp-*` directory, which is ignored and removed):

    model.safetensors      the model weights (tied weights stored once)
    optimizer.safetensors  the optimizer's tensors, `state.<param index>.<name>` (AdamW: step, exp_avg, exp_avg_sq)
    rng.safetensors        each process's torch (and CUDA) generator state and numpy MT19937 key
    config.json            the transformers model config (for inspection; export rebuilds it from the run config)
    state.json             step, tokens seen, optimizer param groups, scheduler, loss scaler, data position,
                           red-flag monitors, best val loss, python/numpy RNG scalars, config and input hashes

No pickle anywhere: tensors go to safetensors and everything else to JSON, so loading a checkpoint never runs
code from the file.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from forge import ForgeError
from forge.lineage import atomic_path

STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:07d}"


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under `root`, oldest first (temp directories of interrupted writes are skipped)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = STEP_DIR.match(path.name)
        if match and path.is_dir() and (path / "state.json").is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def clean_partial(root: Path) -> None:
    """Remove the temp directories that a killed checkpoint write left behind."""
    root = Path(root)
    if root.is_dir():
        for path in root.glob(".step-*"):
            shutil.rmtree(path, ignore_errors=True)


def prune(root: Path, keep_last: int, keep: set[int]) -> list[int]:
    """Delete all checkpoints except the last `keep_last` and the steps in `keep` (the best); return the deleted."""
    checkpoints = list_checkpoints(root)
    recent = {step for step, _ in checkpoints[-keep_last:]}
    deleted = []
    for step, path in checkpoints:
        if step not in recent and step not in keep:
            shutil.rmtree(path)
            deleted.append(step)
    return deleted


# ----------------------------------------------------------------------------------------------------------------
# random number generators


def capture_rng() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """This process's RNG states: tensors (torch, CUDA, numpy key) and JSON scalars (numpy rest, python)."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda{i}"] = state
    kind, key, pos, has_gauss, cached = np.random.get_state()
    tensors["numpy"] = torch.from_numpy(np.asarray(key, dtype=np.int64))
    version, internal, gauss = random.getstate()
    scalars = {"numpy": [kind, int(pos), int(has_gauss), float(cached)], "python": [version, list(internal), gauss]}
    return tensors, scalars


def restore_rng(tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch"])
    if torch.cuda.is_available():
        cuda = [tensors[f"cuda{i}"] for i in range(torch.cuda.device_count()) if f"cuda{i}" in tensors]
        if cuda:
            torch.cuda.set_rng_state_all(cuda)
    kind, pos, has_gauss, cached = scalars["numpy"]
    np.random.set_state((kind, tensors["numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = scalars["python"]
    random.setstate((version, tuple(internal), gauss))


# ----------------------------------------------------------------------------------------------------------------
# optimizer state without pickle


def optimizer_to_safetensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, values in sd["state"].items():
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index), {})[name] = value
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def optimizer_from_safetensors(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
) -> None:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = value
    for index, values in meta["scalars"].items():
        state.setdefault(int(index), {}).update(values)
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


# ----------------------------------------------------------------------------------------------------------------
# save and load


def save(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    rng: list[tuple[dict[str, torch.Tensor], dict[str, Any]]],
    state: dict[str, Any],
) -> Path:
    """Write checkpoint `step` atomically (model, optimizer, every process's RNG, JSON state); return its path."""
    final = step_dir(root, step)
    opt_tensors, opt_meta = optimizer_to_safetensors(optimizer)
    rng_tensors = {f"rank{r}.{k}": v.contiguous() for r, (tensors, _) in enumerate(rng) for k, v in tensors.items()}
    full_state = {**state, "step": step, "optimizer": opt_meta, "rng": [scalars for _, scalars in rng]}
    with atomic_path(final) as tmp:
        tmp.mkdir(parents=True)
        save_model(model, str(tmp / "model.safetensors"))
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        save_file(rng_tensors, str(tmp / "rng.safetensors"))
        if hasattr(model, "config"):
            (tmp / "config.json").write_text(model.config.to_json_string(), encoding="utf-8")
        (tmp / "state.json").write_text(json.dumps(full_state, indent=1) + "\n", encoding="utf-8")
    return final


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / "state.json").read_text(encoding="utf-8"))


def load_weights(path: Path, model: torch.nn.Module) -> None:
    missing, unexpected = load_model(model, str(Path(path) / "model.safetensors"), strict=False)
    if missing or unexpected:
        raise ForgeError(
            f"checkpoint {path} does not fit the model (missing {sorted(missing)[:5]}, unexpected "
            f"{sorted(unexpected)[:5]}); the model config changed: re-run with --force"
        )


def load(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int = 0, device: Any = "cpu"
) -> dict[str, Any]:
    """Restore weights, optimizer and this process's RNG from a checkpoint; return its JSON state."""
    path = Path(path)
    state = read_state(path)
    load_weights(path, model)
    opt_tensors = load_file(str(path / "optimizer.safetensors"), device=str(device))
    optimizer_from_safetensors(optimizer, opt_tensors, state["optimizer"])
    rng = load_file(str(path / "rng.safetensors"))
    prefix = f"rank{rank}."
    mine = {k[len(prefix) :]: v for k, v in rng.items() if k.startswith(prefix)}
    if mine and rank < len(state["rng"]):
        restore_rng(mine, state["rng"][rank])
    return state
