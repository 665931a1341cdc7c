"""Training checkpoints: everything a resumed run needs to continue as if it had never stopped.

Layout of one checkpoint, `runs/<run>/pretrain/checkpoints/step-NNNNNNN/`, written to a hidden temp directory
and renamed into place, so a checkpoint directory is either complete or absent (a SIGKILL mid-write leaves only a
`.step-*.tmp-*` directory, which is ignored and removed):

    model.safetensors      the model weights, whole tensors (tied weights stored once)
    optimizer.safetensors  the optimizer's tensors, whole, `state.<param index>.<name>` (AdamW: step, exp_avg,
                           exp_avg_sq)
    rng.safetensors        each process's torch (and CUDA) generator state and numpy MT19937 key
    config.json            the transformers model config (for inspection; export rebuilds it from the run config)
    state.json             step, tokens seen, optimizer param groups, scheduler, loss scaler, data position,
                           red-flag monitors, best val loss, python/numpy RNG scalars, config and input hashes

No pickle anywhere: tensors go to safetensors and everything else to JSON, so loading a checkpoint never runs
code from the file.

Whole tensors whatever the sharding (train.sharding): under FSDP every process holds a shard of each parameter and
AdamW state. `full_state` gathers them onto the main process (torch.distributed.checkpoint.state_dict: the one path
for checkpoints and the best weights, sharded or not); loading reads the files on the main process, broadcasts each
tensor and every process keeps its part. So a checkpoint resumes under ddp or fsdp alike and the best weights export
as they are; pretrain/resume.py resumes it only on the number of processes that wrote it (the global batch).
Saving and loading are collective under torch.distributed: every process calls them; the main process alone reads
and writes the tensors.
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
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from forge import ForgeError
from forge.io import atomic_path

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
# whole state dicts, sharded or not

GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on the main process's CPU


def full_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model's and the optimizer's whole state on the main process's CPU ({} on the others). Collective: FSDP
    gathers each tensor's shards; unsharded models give their own tensors."""
    weights = get_model_state_dict(model, options=GATHER)
    optim = get_optimizer_state_dict(model, optimizer, options=GATHER) if optimizer is not None else {}
    return weights, optim


def is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def tied_names(model: torch.nn.Module) -> list[list[str]]:
    """Groups of state-dict names that are one parameter (the tied embeddings and head), first name first."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def write_weights(weights: dict[str, torch.Tensor], path: Path, model: torch.nn.Module) -> None:
    """Save whole weights to safetensors, each tied parameter once (under its first name)."""
    aliases = {name for names in tied_names(model) for name in names[1:]}
    save_file({k: v.contiguous() for k, v in weights.items() if k not in aliases}, str(path))


def read_weights(path: Path, model: torch.nn.Module, tensors: bool = True) -> dict[str, torch.Tensor]:
    """The whole weights in `path`/model.safetensors under every name of `model`'s state dict, checked against the
    model; tensors=False: the check alone (the file's header)."""
    with safe_open(str(Path(path) / "model.safetensors"), "pt") as file:
        stored = set(file.keys())
        # a tied parameter is stored under one of its names (the first; older checkpoints: another)
        source = {name: next((n for n in names if n in stored), name) for names in tied_names(model) for name in names}
        names = set(model.state_dict())
        missing, unexpected = {n for n in names if source.get(n, n) not in stored}, stored - names
        if missing or unexpected:
            raise ForgeError(
                f"checkpoint {path} does not fit the model (missing {sorted(missing)[:5]}, unexpected "
                f"{sorted(unexpected)[:5]}); the model config changed: re-run with --force"
            )
        return {name: file.get_tensor(source.get(name, name)) for name in names} if tensors else {}


def scatter_options() -> StateDictOptions:
    # Whole tensors in, each process keeps its part. Under torch.distributed the main process alone reads the files
    # and each tensor is broadcast: one copy of the checkpoint in a node's memory, not one per process.
    return StateDictOptions(full_state_dict=True, broadcast_from_rank0=dist.is_initialized())


def load_weights(path: Path, model: torch.nn.Module) -> None:
    """Load `path`/model.safetensors into `model`, sharded or not. Collective; every process checks the file's
    header (a misfit fails everywhere, not on the main process alone)."""
    set_model_state_dict(model, read_weights(path, model, tensors=is_main()), options=scatter_options())


# ----------------------------------------------------------------------------------------------------------------
# optimizer state without pickle: tensors keyed by the parameter's index in the optimizer, as torch numbers them


def param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The optimizer's parameters in torch's state-dict order, by the names torch.distributed.checkpoint keys them."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def optimizer_to_safetensors(optim: dict[str, Any], order: list[str]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A whole optimizer state dict (keyed by parameter name) as safetensors tensors and JSON scalars (by index)."""
    index = {name: i for i, name in enumerate(order)}
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for name, values in optim["state"].items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index[name]}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index[name]), {})[key] = value
    groups = [
        {k: [index[n] for n in v] if k == "params" else list(v) if isinstance(v, tuple) else v for k, v in g.items()}
        for g in optim["param_groups"]
    ]
    return tensors, {"param_groups": groups, "scalars": scalars}


def optimizer_from_safetensors(
    tensors: dict[str, torch.Tensor], meta: dict[str, Any], order: list[str]
) -> dict[str, Any]:
    state: dict[str, dict[str, Any]] = {}
    for key, value in tensors.items():
        _, index, name = key.split(".", 2)
        state.setdefault(order[int(index)], {})[name] = value
    for index, values in meta["scalars"].items():
        state.setdefault(order[int(index)], {}).update(values)
    groups = [{k: [order[i] for i in v] if k == "params" else v for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


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
    """Write checkpoint `step` atomically (model, optimizer, every process's RNG, JSON state); return its path.
    Collective: every process calls it (FSDP gathers the shards); the main process writes."""
    final = step_dir(root, step)
    weights, optim = full_state(model, optimizer)
    if not is_main():
        return final
    opt_tensors, opt_meta = optimizer_to_safetensors(optim, param_names(model, optimizer))
    rng_tensors = {f"rank{r}.{k}": v.contiguous() for r, (tensors, _) in enumerate(rng) for k, v in tensors.items()}
    saved = {**state, "step": step, "optimizer": opt_meta, "rng": [scalars for _, scalars in rng]}
    with atomic_path(final) as tmp:
        tmp.mkdir(parents=True)
        write_weights(weights, tmp / "model.safetensors", model)
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        save_file(rng_tensors, str(tmp / "rng.safetensors"))
        if hasattr(model, "config"):
            (tmp / "config.json").write_text(model.config.to_json_string(), encoding="utf-8")
        (tmp / "state.json").write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")
    return final


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / "state.json").read_text(encoding="utf-8"))


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int = 0) -> dict[str, Any]:
    """Restore weights, optimizer and this process's RNG from a checkpoint; return its JSON state. Collective: the
    main process reads the tensors, every process keeps its part (its shard under FSDP)."""
    path = Path(path)
    state = read_state(path)
    load_weights(path, model)
    optim = {}
    if is_main():
        tensors = load_file(str(path / "optimizer.safetensors"))
        optim = optimizer_from_safetensors(tensors, state["optimizer"], param_names(model, optimizer))
    set_optimizer_state_dict(model, optimizer, optim, options=scatter_options())
    for group in optimizer.param_groups:  # JSON (and torch's loader) turn tuples into lists: AdamW's betas
        group.update({k: tuple(v) for k, v in group.items() if isinstance(v, list) and k != "params"})
    rng = load_file(str(path / "rng.safetensors"))
    prefix = f"rank{rank}."
    mine = {k[len(prefix) :]: v for k, v in rng.items() if k.startswith(prefix)}
    if mine and rank < len(state["rng"]):
        restore_rng(mine, state["rng"][rank])
    return state
