"""Training checkpoints: everything a resumed run needs to continue as if it had never stopped, written by every
process as it holds it (its shards under FSDP), read back by any number of processes under either sharding.

Layout of one checkpoint, `runs/<run>/pretrain/checkpoints/step-NNNNNNN/`, written to a hidden temp directory
and renamed into place, so a checkpoint directory is either complete or absent (a SIGKILL mid-write leaves only a
`.step-*.tmp` directory, which is ignored and removed at the next start):

    tensors/shard-0000R-model-00001-of-00001.safetensors
                           the tensors process R-1 holds, through torch.distributed.checkpoint (DCP) and its
                           HuggingFaceStorageWriter: `model.<name>` (the weights, a tied parameter once, under its
                           first name) and `optim.<parameter name>.<state>` (AdamW: step, exp_avg, exp_avg_sq).
                           Each file's header records where its pieces sit in the whole tensors (DCP_SHARDING_INFO),
                           so every tensor is written once by one process (a replicated one by one of its holders)
                           and any sharding on any number of processes reads back the slices it holds.
    rng-0000R.safetensors  process R's torch (and CUDA) generator state and numpy MT19937 key
    config.json            the transformers model config (for inspection; export rebuilds it from the run config)
    state.json             step, tokens seen, the processes and global batch that wrote it, the optimizer's param
                           groups and non-tensor state, scheduler, loss scaler, data position, red-flag monitors,
                           best val loss, python/numpy RNG scalars, config and input hashes

No pickle anywhere: DCP's default FileSystemWriter pickles its `.metadata` file, the HuggingFace storage writes
safetensors alone (the reader rebuilds the metadata from the files' headers); everything else is JSON, so loading
a checkpoint never runs code from a file. No tensor is gathered to write a checkpoint: under FSDP each process
writes its 1/N. `best/` holds the best weights the same way (model tensors only); the one gather of whole weights
is the export at the end of the run (`read_weights`: the main process reads every shard file, no process group).

The tensors of a checkpoint go to disk in a background thread (on a gloo group of its own, so that its collectives
never interleave with training's): training goes on once they are copied to CPU memory. The thread renames the
checkpoint into place as soon as every process has written its part; the next one starts, and the run ends or
fails, only after that (CheckpointWriter.wait). Not dcp.async_save: its future completes before its callbacks run,
so the rename would have to wait for the next save, and a kill before it would lose a written checkpoint.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from forge import ForgeError
from forge.io import remove_path

STEP_DIR = re.compile(r"^step-(\d+)$")
FORMAT = "dcp-safetensors/1"  # in state.json: what this module reads (the whole-tensor files before it are not)
TENSORS = "tensors"  # the DCP shard files' directory inside a checkpoint and in best/

# One process without a process group (and the export, on purpose): DCP warns at every save and load, from the
# background thread too, that it assumes one process, which is what is meant.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:07d}"


def temp_dir(final: Path) -> Path:
    """Where every process writes `final` before the main process renames it: one name all processes agree on."""
    return final.with_name(f".{final.name}.tmp")


def aside_dir(final: Path) -> Path:
    """Where `publish` keeps the directory it replaces until the new one is in place."""
    return final.with_name(f".{final.name}.old")


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
    """Undo what a kill during a write left behind: the temp directories go, and best weights caught between
    `publish`'s two renames are put back."""
    root = Path(root)
    if not root.is_dir():
        return
    for aside in list(root.glob(".*.old")):  # aside_dir's names
        final = root / aside.name.removeprefix(".").removesuffix(".old")
        if not final.exists():
            aside.replace(final)
    for path in [*root.glob(".step-*"), *root.glob(".best.*")]:
        shutil.rmtree(path, ignore_errors=True)


def prune(root: Path, keep_last: int, keep: set[int]) -> list[int]:
    """Delete all checkpoints except the last `keep_last` and the steps in `keep`; return the deleted."""
    checkpoints = list_checkpoints(root)
    recent = {step for step, _ in checkpoints[-keep_last:]}
    deleted = []
    for step, path in checkpoints:
        if step not in recent and step not in keep:
            shutil.rmtree(path)
            deleted.append(step)
    return deleted


def publish(tmp: Path, final: Path) -> None:
    """Rename a written temp directory onto its final name (the main process, once every process has written).
    A directory cannot be renamed onto another that holds files, so the one it replaces (best/) is first renamed
    aside and removed after: at every instant one complete copy is on disk under a name clean_partial knows."""
    aside = aside_dir(final)
    remove_path(aside)
    if final.exists():
        final.replace(aside)
    tmp.replace(final)
    remove_path(aside)


# ----------------------------------------------------------------------------------------------------------------
# the process group


def is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def gather_to_main(value: Any) -> list[Any]:
    """Every process's `value`, in rank order, on the main process ([] on the others)."""
    if not dist.is_initialized():
        return [value]
    out: list[Any] = [None] * dist.get_world_size() if is_main() else []
    dist.gather_object(value, out if is_main() else None, dst=0)
    return out


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


def rng_file(path: Path, process: int) -> Path:
    return Path(path) / f"rng-{process:05d}.safetensors"


# ----------------------------------------------------------------------------------------------------------------
# the tensors, as each process holds them (DTensor shards under FSDP), keyed by name


def tied_names(model: torch.nn.Module) -> list[list[str]]:
    """Groups of state-dict names that are one parameter (the tied embeddings and head), first name first."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def model_tensors(model: torch.nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """`model.<name>` -> the tensor this process holds (the parameter's own storage: a load fills the model), each
    tied parameter once, under its first name."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    aliases = {name for names in tied_names(model) for name in names[1:]}
    state = get_model_state_dict(model) if state is None else state
    return {f"model.{name}": tensor for name, tensor in state.items() if name not in aliases}


def untie(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's whole state dict from `model_tensors`: every name of a tied parameter gets its tensor."""
    state = {name.removeprefix("model."): t for name, t in tensors.items() if name.startswith("model.")}
    for names in tied_names(model):
        state.update(dict.fromkeys(names[1:], state[names[0]]))
    return state


def optimizer_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict]:
    """The optimizer state this process holds: tensors as `optim.<parameter name>.<state>` (its shards under
    FSDP) and the rest for state.json (param groups by parameter name, non-tensor state). A fresh optimizer's
    state is created first (torch's zero-gradient step at lr 0), so that a load has tensors to fill."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    optim = get_optimizer_state_dict(model, optimizer)
    tensors: dict[str, Any] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for name, values in optim["state"].items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{name}.{key}"] = value
            else:
                scalars.setdefault(name, {})[key] = value
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in optim["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, tensors: dict, meta: dict) -> None:
    """Set the optimizer from the tensors read into `optimizer_tensors`' dict and state.json's rest."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    state: dict[str, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            name, part = key.removeprefix("optim.").rsplit(".", 1)
            state.setdefault(name, {})[part] = value
    for name, values in meta["scalars"].items():
        state.setdefault(name, {}).update(values)
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": meta["param_groups"]})
    for group in optimizer.param_groups:  # JSON turns tuples into lists: AdamW's betas
        group.update({k: tuple(v) for k, v in group.items() if isinstance(v, list) and k != "params"})


def write_tensors(directory: Path, tensors: dict[str, Any], group: Any = None) -> None:
    """Each process writes the tensors it holds into `directory` (safetensors, no pickle), over `group` (None: the
    default process group, or none with one process). Collective: it returns once every process has written."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter

    dcp.save(tensors, storage_writer=HuggingFaceStorageWriter(str(directory), save_distributed=True),
             process_group=group)  # fmt: skip


def read_tensors(directory: Path, tensors: dict[str, Any], collective: bool = True) -> None:
    """Fill `tensors` (each process's own, any sharding) in place from the shard files in `directory`, whichever
    processes wrote them. Collective unless collective=False (one process reading whole tensors)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

    check_fits(directory, tensors)
    dcp.load(tensors, storage_reader=HuggingFaceStorageReader(str(directory)), no_dist=not collective)


def check_fits(directory: Path, tensors: dict[str, Any]) -> None:
    """The shard files in `directory` hold every tensor of `tensors` at its whole shape (their headers alone)."""
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

    if not Path(directory).is_dir():
        raise ForgeError(f"{directory} is missing: the checkpoint is incomplete; re-run with --force")
    metadata = HuggingFaceStorageReader(str(directory)).read_metadata().state_dict_metadata
    stored = {name: tuple(getattr(m, "size", ())) for name, m in metadata.items()}
    wanted = {name: tuple(t.shape) for name, t in tensors.items()}
    missing = sorted(n for n in wanted if n not in stored)
    misfit = sorted(n for n in wanted if n in stored and stored[n] != wanted[n])
    if missing or misfit:
        raise ForgeError(
            f"checkpoint {Path(directory).parent} does not fit the model (missing {missing[:5]}, other shapes "
            f"{misfit[:5]}); the model config changed: re-run with --force"
        )


# ----------------------------------------------------------------------------------------------------------------
# the best weights: model tensors only, written the same way; read whole once, by the export


def save_weights(final: Path, model: torch.nn.Module, best: dict[str, Any]) -> None:
    """The weights as every process holds them, and `best` (step, val loss) in state.json, written to `final`
    atomically. Collective; nothing is gathered."""
    tmp = temp_dir(final)
    write_tensors(tmp / TENSORS, model_tensors(model))  # returns once every process has written its files
    if is_main():
        (tmp / "state.json").write_text(json.dumps({**best, "format": FORMAT}) + "\n", encoding="utf-8")
        publish(tmp, final)


def read_weights(path: Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights in `path` (best/ or a checkpoint) under every name of `model`'s state dict, read into
    `model` itself: an unsharded model on one process, whichever processes and sharding wrote them (no process
    group: the export's one gather of whole weights, from the files)."""
    tensors = model_tensors(model, model.state_dict())
    read_tensors(Path(path) / TENSORS, tensors, collective=False)
    return untie(model, tensors)


# ----------------------------------------------------------------------------------------------------------------
# save and load


class CheckpointWriter:
    """Writes a run's checkpoints under `root`, one at a time, and renames each into place as soon as every process
    has written it; the oldest beyond `keep_last` go then. Every process makes one (collective: the background
    writes get a gloo process group of their own, so that their collectives never interleave with training's) and
    calls save and wait at the same steps. asynchronous=False writes each checkpoint before save returns."""

    def __init__(self, root: Path, keep_last: int, asynchronous: bool = True) -> None:
        self.root, self.keep_last, self.asynchronous = Path(root), keep_last, asynchronous
        self.group = dist.new_group(backend="gloo") if asynchronous and dist.is_initialized() else None
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> Path:
        """Write checkpoint `step` once the previous one is in place; return its final path. Asynchronous: the
        tensors are copied to CPU memory (DCP's BlockingAsyncStager) before save returns, so training may change
        them at once, and a thread writes the copy and renames the checkpoint into place."""
        self.wait()
        final = step_dir(self.root, step)
        tmp = temp_dir(final)
        tmp.mkdir(parents=True, exist_ok=True)
        rng, rng_scalars = capture_rng()
        save_file({k: v.contiguous() for k, v in rng.items()}, str(rng_file(tmp, rank())))
        tensors, optim = optimizer_tensors(model, optimizer)
        tensors = model_tensors(model) | tensors
        scalars = gather_to_main(rng_scalars)
        if is_main():
            saved = {**state, "format": FORMAT, "step": step, "optimizer": optim, "rng": scalars}
            if hasattr(model, "config"):
                (tmp / "config.json").write_text(model.config.to_json_string(), encoding="utf-8")
            (tmp / "state.json").write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")
        if not self.asynchronous:
            self.finish(tmp, final, tensors)
            return final
        from torch.distributed.checkpoint.staging import BlockingAsyncStager

        staged = BlockingAsyncStager().stage(tensors)
        self.thread = threading.Thread(target=self.background, args=(tmp, final, staged), name="forge-checkpoint")
        self.thread.start()
        return final

    def finish(self, tmp: Path, final: Path, tensors: dict[str, Any]) -> None:
        """Every process writes its tensors; the main process, once all have, renames the checkpoint into place
        and prunes the old ones."""
        write_tensors(tmp / TENSORS, tensors, self.group)
        if is_main():
            publish(tmp, final)
            prune(self.root, self.keep_last, keep=set())

    def background(self, tmp: Path, final: Path, tensors: dict[str, Any]) -> None:
        try:
            self.finish(tmp, final, tensors)
        except BaseException as exc:  # raised by wait(), in the training thread
            self.error = exc

    def wait(self) -> None:
        """Block until the checkpoint being written is in place; raise what went wrong writing it."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / "state.json").read_text(encoding="utf-8"))


def check_format(path: Path, state: dict[str, Any]) -> None:
    """A checkpoint of another format (the whole-tensor files of forge before sharded checkpoints) is refused."""
    if state.get("format") != FORMAT:
        written = state.get("format", "whole tensors, before sharded checkpoints")
        raise ForgeError(f"{path} is in another checkpoint format ({written}; this forge reads {FORMAT}): re-run "
                         "with --force to start over")  # fmt: skip


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore weights, optimizer and this process's RNG from a checkpoint; return its JSON state. Collective:
    each process reads the slices of the shard files it holds, whatever the sharding and the number of processes
    that wrote them. A process that the checkpoint has no RNG state for (more processes than wrote it) keeps its
    own."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    path = Path(path)
    state = read_state(path)
    check_format(path, state)
    tensors, _ = optimizer_tensors(model, optimizer)
    tensors = model_tensors(model) | tensors
    read_tensors(path / TENSORS, tensors)
    set_model_state_dict(model, untie(model, tensors))
    load_optimizer(model, optimizer, tensors, state["optimizer"])
    mine = rng_file(path, rank())
    if mine.is_file() and rank() < len(state["rng"]):
        restore_rng(load_file(str(mine)), state["rng"][rank()])
    return state
