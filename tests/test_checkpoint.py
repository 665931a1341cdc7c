"""Checkpoints on one process: the sharded format (torch.distributed.checkpoint through safetensors, no pickle)
written and read back exactly, the best weights read whole, pruning and the leftovers of a killed write, and which
process counts a checkpoint resumes on. Two processes and other shardings: tests/test_scale_train.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from forge import ForgeError
from pretrain import checkpoint as ckpt


def tied_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
    model[1].weight = model[0].weight  # tied, as the llama head is
    return model


def assert_no_pickle(directory: Path) -> None:
    """Every file under `directory` is JSON or safetensors (8-byte header length, a JSON header, then exactly the
    tensor bytes it lists): nothing a load could unpickle. Not a first-byte test: a safetensors file starts with its
    header length, whose low byte may be 0x80, pickle's PROTO opcode."""
    files = [p for p in directory.rglob("*") if p.is_file()]
    assert files and not [p for p in files if p.name.endswith(".metadata")], "DCP's pickled metadata file"
    for path in files:
        data = path.read_bytes()
        if path.suffix == ".json":
            json.loads(data)
            continue
        assert path.suffix == ".safetensors", path
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + size])
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        assert 8 + size + end == len(data), path


def test_checkpoint_round_trip_restores_model_optimizer_and_rng(tmp_path):
    model = tied_model(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        model(torch.tensor([1, 2])).sum().backward()
        opt.step()
    writer = ckpt.CheckpointWriter(tmp_path, keep_last=10)  # tensors written by a background thread
    path = writer.save(5, model, opt, {"note": "x"})
    expected_draw = torch.rand(3)
    saved = model[0].weight.detach().clone()
    with torch.no_grad():
        model[0].weight.add_(1.0)  # training goes on: the checkpoint holds the copy taken at save
    assert writer.thread is not None
    writer.thread.join()
    assert path.is_dir(), "the writing thread renames the checkpoint into place, not the next save"
    writer.wait()
    with torch.no_grad():
        model[0].weight.copy_(saved)
    assert sorted(p.name for p in path.iterdir()) == ["rng-00000.safetensors", "state.json", "tensors"]
    shards = load_file(path / "tensors" / "shard-00001-model-00001-of-00001.safetensors")
    assert "model.0.weight" in shards and "model.1.weight" not in shards, "a tied weight is stored once"
    assert {k for k in shards if k.startswith("optim.")} == {f"optim.{p}.{s}" for p in ("0.weight", "1.bias")
                                                              for s in ("step", "exp_avg", "exp_avg_sq")}  # fmt: skip
    assert_no_pickle(path)

    other = tied_model(99)
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-2)
    state = ckpt.load(path, other, other_opt)
    assert state["note"] == "x" and state["step"] == 5 and state["format"] == ckpt.FORMAT
    assert torch.equal(other[0].weight, model[0].weight) and other[1].weight is other[0].weight
    assert torch.equal(torch.rand(3), expected_draw), "the torch RNG continues where the checkpoint was taken"
    a, b = opt.state_dict(), other_opt.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for index, values in a["state"].items():
        assert all(torch.equal(values[k], b["state"][index][k]) for k in values)
    assert float(b["state"][0]["step"]) == 3, "the step count read back, not the zero-gradient step of the init"

    # the best weights: model tensors only, read whole by one process; a model of another shape is refused
    ckpt.save_weights(tmp_path / "best", model, {"step": 5, "val_loss": 1.0})
    assert_no_pickle(tmp_path / "best")
    fresh = tied_model(7)
    whole = ckpt.read_weights(tmp_path / "best", fresh)
    assert sorted(whole) == ["0.weight", "1.bias", "1.weight"] and torch.equal(fresh[0].weight, model[0].weight)
    with pytest.raises(ForgeError, match=r"does not fit the model .*other shapes \['model.0.weight'"):
        ckpt.read_weights(tmp_path / "best", torch.nn.Sequential(torch.nn.Embedding(12, 4), torch.nn.Linear(4, 12)))
    ckpt.save_weights(tmp_path / "best", model, {"step": 6, "val_loss": 0.5})  # a better one replaces it
    assert json.loads((tmp_path / "best" / "state.json").read_text())["step"] == 6
    assert not list(tmp_path.glob(".best*")), "nothing left aside"
    old = tmp_path / "old"
    old.mkdir()
    (old / "state.json").write_text(json.dumps({"step": 1}))
    with pytest.raises(ForgeError, match="another checkpoint format .*re-run with --force"):
        ckpt.load(old, other, other_opt)

    for step in (10, 15, 20):
        writer.save(step, model, opt, {})
    writer.wait()
    (tmp_path / ".step-0000025.tmp").mkdir()  # what a SIGKILL during a write leaves
    (tmp_path / "best").replace(tmp_path / ".best.old")  # ... or one between publish's two renames of best/
    (tmp_path / ".best.tmp").mkdir()
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [5, 10, 15, 20]
    assert ckpt.prune(tmp_path, keep_last=2, keep={5}) == [10]
    ckpt.clean_partial(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "old", "step-0000005", "step-0000015",
                                                           "step-0000020"]  # fmt: skip
    assert ckpt.read_weights(tmp_path / "best", fresh)["0.weight"].shape == model[0].weight.shape, "best/ is back"
    pruning = ckpt.CheckpointWriter(tmp_path, keep_last=2, asynchronous=False)
    pruning.save(30, model, opt, {})
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [20, 30], "the writer keeps the last keep_last"


def test_a_checkpoint_resumes_on_process_counts_that_keep_its_global_batch():
    from pretrain.resume import grad_accum_for

    written = {"global_batch": 8, "world_size": 2, "grad_accum_steps": 2}  # 2 processes x 2 windows x 2 steps
    assert [grad_accum_for(Path("c"), written, 2, world) for world in (1, 2, 4)] == [4, 2, 1]
    with pytest.raises(ForgeError) as refused:
        grad_accum_for(Path("step-0000006"), written, 2, 3)
    assert str(refused.value) == (
        "pretrain: step-0000006 was written by 2 process(es), a global batch of 8 sequences (2 x "
        "train.micro_batch_size 2 x train.grad_accum_steps 2); on 3 process(es) no whole train.grad_accum_steps "
        "keeps it (8 / (3 x 2) = 1.33333). Resume it on 1, 2, 4 process(es) (accelerate launch / torchrun "
        "--nproc-per-node x --nnodes), or start over with --force"
    )
    with pytest.raises(ForgeError, match=r"on 8 process\(es\) .* = 0.5\)"):
        grad_accum_for(Path("c"), written, 2, 8)
