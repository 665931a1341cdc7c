"""`forge pretrain` on a tiny model and a synthetic corpus: the loop, checkpoints, exact resume after SIGKILL,
data parallelism, red flags, NaN handling and the exported model.

The corpus is generated (a small grammar of sentences), its tokenizer is a 512-token byte-level BPE and its
shards are written with `pretrain.token_shards.write_shards`, the tokenizer stage's own writer.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from forge import ForgeError
from forge.config import load_config
from pretrain import checkpoint as ckpt
from pretrain.loader import IGNORE, WindowLoader, iter_eval_batches
from pretrain.monitor import Diverged, LossSpikes, ValRise

REPO = Path(__file__).resolve().parent.parent
SPECIALS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]", "<|system|>", "<|user|>", "<|assistant|>"]
TINY = [
    "model.architecture=llama", "model.hidden_size=64", "model.num_layers=2", "model.num_attention_heads=2",
    "model.intermediate_size=192", "model.context_length=64", "model.vocab_size=null",
    "train.micro_batch_size=8", "train.grad_accum_steps=1", "train.max_steps=40", "train.lr=3e-3",
    "train.warmup_steps=5", "train.eval_every=10", "train.eval_batches=4", "train.checkpoint_every=10",
    "train.keep_checkpoints=2", "train.log_every=10", "train.precision=fp32", "seed=7",
]  # fmt: skip
CHILD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


# ----------------------------------------------------------------------------------------------------------------
# a synthetic corpus, tokenizer and shards, built once per session


def synthetic_text(n_docs: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    nouns = ["module", "function", "parser", "socket", "thread", "buffer", "string", "list", "queue", "file"]
    verbs = ["returns", "reads", "writes", "closes", "opens", "sorts", "joins", "splits", "locks", "copies"]
    adjs = ["empty", "large", "sorted", "binary", "shared", "remote", "cached", "frozen"]
    docs = []
    for _ in range(n_docs):
        sentences = []
        for _ in range(rng.randint(3, 8)):
            a, b = rng.choice(nouns), rng.choice(nouns)
            sentences.append(f"The {rng.choice(adjs)} {a} {rng.choice(verbs)} the {b}.")
        docs.append(" ".join(sentences))
    return docs


@pytest.fixture(scope="session")
def synthetic_tokenizer_dir(tmp_path_factory) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from pretrain.token_shards import write_shards

    root = tmp_path_factory.mktemp("synthetic")
    out = root / "tokenizer"
    out.mkdir()
    splits = {"train": synthetic_text(1500, 1), "val": synthetic_text(60, 2), "test": synthetic_text(60, 3)}
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(splits["train"], trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="[BOS]", eos_token="[EOS]", pad_token="[PAD]", unk_token="[UNK]"
    )
    hf.chat_template = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    hf.save_pretrained(out)
    assert (out / "chat_template.jinja").is_file()
    parquet = {}
    for split, docs in splits.items():
        path = root / f"{split}-00000.parquet"
        pq.write_table(pa.table({"text": docs}), path)
        parquet[split] = [path]
    write_shards(tok, parquet, out / "shards", {"pad": 0, "unk": 1, "bos": 2, "eos": 3})
    (out / "manifest.json").write_text(json.dumps({"stage": "tokenizer", "status": "complete"}), encoding="utf-8")
    return out


@pytest.fixture(scope="session")
def shared_tracking(tmp_path_factory) -> str:
    """One MLflow store for these tests: creating a fresh sqlite store costs seconds (its migrations) per test."""
    return "registry.tracking_uri=sqlite:///" + str(tmp_path_factory.mktemp("mlflow") / "mlflow.db")


@pytest.fixture
def tiny_run(synthetic_tokenizer_dir, isolated_runs, shared_tracking):
    """A function that places the synthetic tokenizer under runs/<name>/ and returns that run's config."""

    def make(name: str, *overrides: str):
        tok = isolated_runs / name / "tokenizer"
        if not tok.exists():
            shutil.copytree(synthetic_tokenizer_dir, tok)
        return load_config(None, [*TINY, shared_tracking, f"run_name={name}", *overrides])

    return make


@contextlib.contextmanager
def one_thread():
    """In-process runs with the threads of the child processes (OMP_NUM_THREADS=1): the same float sums."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "pretrain" / "metrics.jsonl").read_text().splitlines()]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(run_dir) if "loss" in r}


def val_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["val_loss"] for r in records(run_dir) if "val_loss" in r}


def forge_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "forge.cli", "pretrain", *args]


def child_env(runs: Path) -> dict[str, str]:
    return {**os.environ, **CHILD_ENV, "FORGE_RUNS_DIR": str(runs)}


def sets(*overrides: str) -> list[str]:
    return [arg for item in overrides for arg in ("--set", item)]


# ----------------------------------------------------------------------------------------------------------------
# pieces: loader, monitors, checkpoints


def test_loader_is_a_pure_function_of_its_position_and_splits_the_global_batch():
    tokens = np.arange(10_000, dtype=np.uint16)
    one = WindowLoader(tokens, context_length=16, seed=3)
    steps = [one.next_step(4, 2) for _ in range(5)]
    x, y = steps[0][0]
    assert x.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1]), "targets are the inputs shifted by one"

    resumed = WindowLoader(tokens, context_length=16, seed=3)
    resumed.load_state_dict(json.loads(json.dumps(WindowLoader(tokens, 16, 3).state_dict() | {"position": 24})))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(resumed.next_step(4, 2), steps[3], strict=True))

    two = [WindowLoader(tokens, context_length=16, seed=3) for _ in range(2)]
    for step in steps:
        ours = torch.cat([x for x, _ in step])
        theirs = torch.cat([x for r in (0, 1) for x, _ in two[r].next_step(4, 1, rank=r, world_size=2)])
        assert torch.equal(ours, theirs), "2 processes x 4 windows must see the 1 process x 8 windows batch"

    epoch = WindowLoader(tokens, context_length=16, seed=3)
    starts = epoch.starts(0, epoch.windows_per_epoch)
    assert len(set(starts.tolist())) == epoch.windows_per_epoch, "an epoch visits every window once"
    assert not np.array_equal(starts, epoch.starts(epoch.windows_per_epoch, epoch.windows_per_epoch))


def test_val_rise_flags_after_patience_and_resets_on_a_new_minimum():
    monitor = ValRise(patience=3)
    flags = [monitor.update(step, loss) for step, loss in enumerate([5.0, 4.0, 3.0, 3.1, 3.2, 2.9, 3.0, 3.5, 3.6])]
    assert [i for i, f in enumerate(flags) if f] == [8]
    assert monitor.best == 2.9 and monitor.best_step == 5
    restored = ValRise(3)
    restored.load_state_dict(json.loads(json.dumps(monitor.state_dict())))
    assert restored.state_dict() == monitor.state_dict()


def test_loss_spikes_by_zscore():
    monitor = LossSpikes(window=20, zscore=4.0)
    rng = random.Random(0)
    flagged = [
        step for step in range(60) if monitor.update(step, 3.0 + rng.gauss(0, 0.01) + (1.0 if step == 40 else 0))
    ]
    assert flagged == [40]
    assert max(monitor.history) < 3.5, "a spike must not enter the window"


def test_eval_batches_are_as_many_on_every_process():
    """FSDP's forward is collective: a process out of windows runs one more whose targets are all ignored."""
    tokens = np.arange(1000, dtype=np.uint16)
    starts = np.arange(5) * 17
    shares = [list(iter_eval_batches(tokens, starts, 16, 2, rank, 2)) for rank in (0, 1)]
    assert [len(s) for s in shares] == [2, 2]
    counted = sorted(
        int(x[i, 0]) for share in shares for x, y in share for i in range(len(x)) if (y[i] != IGNORE).all()
    )
    assert counted == starts.tolist(), "every window counted once"
    assert (shares[1][1][1] == IGNORE).all(), "rank 1 has 2 windows: its second batch is padding"


def test_fsdp_on_one_process_trains_unsharded_and_refuses_fp16(caplog):
    from pretrain.sharding import use_fsdp

    tcfg = load_config(None, ["train.sharding=fsdp"]).train
    with caplog.at_level("WARNING", logger="forge.pretrain"):
        assert use_fsdp(tcfg, 1, "fp16") is False
    assert "train.sharding=fsdp on 1 process: nothing to shard" in caplog.text
    assert use_fsdp(tcfg, 2, "bf16") is True
    assert use_fsdp(tcfg.model_copy(update={"sharding": "ddp"}), 2, "fp32") is False
    with pytest.raises(ForgeError, match="train.sharding=fsdp with fp16: .* set train.precision=bf16"):
        use_fsdp(tcfg, 2, "fp16")


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    from pretrain.trainer import lr_factor

    tcfg = load_config(None, ["train.warmup_steps=10", "train.max_steps=110", "train.min_lr_ratio=0.1"]).train
    factors = [lr_factor(s, tcfg) for s in range(111)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[60] == pytest.approx(0.55) and factors[110] == pytest.approx(0.1)
    assert all(factors[i] >= factors[i + 1] for i in range(9, 110)), "cosine decay never rises"


def test_weight_decay_groups_exclude_norms_biases_and_embeddings(tiny_run):
    from pretrain.model import build_model
    from pretrain.trainer import make_optimizer

    for arch, activation in (("llama", "silu"), ("gpt2", "gelu_new")):
        cfg = tiny_run("wd", f"model.architecture={arch}", f"model.activation={activation}")
        model = build_model(cfg.model, 512)
        decay, no_decay = make_optimizer(model, cfg.train, torch.device("cpu")).param_groups
        names = {id(p): n for n, p in model.named_parameters()}
        assert decay["weight_decay"] == cfg.train.weight_decay and no_decay["weight_decay"] == 0.0
        decayed = {names[id(p)] for p in decay["params"]}
        assert decayed and all(p.ndim == 2 for p in decay["params"])
        assert not any("norm" in n or "ln_" in n or "embed" in n or "wte" in n or "wpe" in n for n in decayed)
        assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


# ----------------------------------------------------------------------------------------------------------------
# the stage


@pytest.mark.slow
def test_pretrain_learns_checkpoints_exports_and_skips(tiny_run, isolated_runs, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forge import lineage
    from pretrain.train import run

    real = lineage.hash_inputs

    cfg = tiny_run("learn", "train.gradient_checkpointing=true")
    hashed = []
    monkeypatch.setattr(lineage, "hash_inputs", lambda inputs: hashed.append(sorted(inputs)) or real(inputs))

    manifest = run(cfg)
    assert len(hashed) == 1, "the inputs (every token shard) are hashed once per start"
    out = isolated_runs / "learn" / "pretrain"
    m = manifest["metrics"]
    assert manifest["status"] == "complete" and m["steps"] == 40
    assert m["tokens"] == 40 * 8 * 64 and m["tokens_per_s"] > 0 and 0 < m["mfu"] < 1
    assert m["final_val_loss"] < 0.7 * m["initial_val_loss"], m
    assert m["best_val_loss"] == min(val_losses(isolated_runs / "learn").values())
    assert sorted(val_losses(isolated_runs / "learn")) == [0, 10, 20, 30, 40]
    assert [s for s, _ in ckpt.list_checkpoints(out / "checkpoints")] == [30, 40], "keep the last 2"
    assert (out / "loss_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "chat_template.jinja"):  # fmt: skip
        assert (out / "model" / name).is_file(), name

    model = AutoModelForCausalLM.from_pretrained(out / "model")
    tok = AutoTokenizer.from_pretrained(out / "model")
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "<|user|>hi"
    ids = tok("The empty module", return_tensors="pt").input_ids
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=8, do_sample=False)
        logits = model(ids).logits
    assert gen.shape[1] > ids.shape[1] and torch.isfinite(logits).all()
    best = json.loads((out / "model" / "forge_pretrain.json").read_text())
    assert best["best_step"] == m["best_step"]

    assert run(cfg)["finished_at"] == manifest["finished_at"], "an unchanged re-run is skipped"


@pytest.mark.slow
def test_sigkill_and_resume_gives_the_same_losses(tiny_run, isolated_runs, shared_tracking, caplog):
    """A real `forge pretrain` process killed with SIGKILL after its first checkpoint, then the stage re-run: every
    later step has the same loss as an uninterrupted run (which runs in-process, on one thread like the child)."""
    from pretrain.train import run

    # dropout draws from the torch RNG at every step: the resumed run must restore that state too
    long = ("train.max_steps=120", "train.log_every=1", "train.checkpoint_every=15", "model.dropout=0.1")
    with one_thread():
        run(tiny_run("straight", *long))
    killed_cfg = tiny_run("killed", *long)
    killed = isolated_runs / "killed" / "pretrain"
    cli_args = sets(*TINY, shared_tracking, *long, "run_name=killed")
    proc = subprocess.Popen(forge_cmd(*cli_args), env=child_env(isolated_runs), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.time() + 240
    while not ckpt.list_checkpoints(killed / "checkpoints") and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    manifest = json.loads((killed / "manifest.json").read_text())
    assert manifest["status"] == "running", "the kill must land before the run completed"
    killed_at = max(losses(isolated_runs / "killed"))
    assert killed_at < 120

    with one_thread(), caplog.at_level("INFO", logger="forge.pretrain"):
        assert run(killed_cfg)["status"] == "complete"
    assert "resumed from" in caplog.text
    a, b = losses(isolated_runs / "straight"), losses(isolated_runs / "killed")
    assert sorted(a) == sorted(b) == list(range(1, 121))
    assert {s: f"{v:.4f}" for s, v in a.items()} == {s: f"{v:.4f}" for s, v in b.items()}
    assert a == b, "on CPU the resumed run is bit-identical"
    assert val_losses(isolated_runs / "straight") == val_losses(isolated_runs / "killed")


@pytest.mark.slow
def test_two_processes_follow_the_one_process_loss_curve(tiny_run, isolated_runs, shared_tracking):
    """`accelerate launch` with 2 CPU processes (gloo), 2 windows x 2 accumulation steps each, against 1 process
    with 8-window micro-batches: the same global batch, so the same run up to float summation order."""
    from pretrain.train import run

    short = ("train.max_steps=20", "train.checkpoint_every=20")
    one = run(tiny_run("one", *short))
    assert one["status"] == "complete"
    tiny_run("two")
    accelerate = str(Path(sys.executable).with_name("accelerate"))
    two = ("run_name=two", "train.micro_batch_size=2", "train.grad_accum_steps=2")
    cmd = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
           "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()), "-m", "forge.cli", "pretrain",
           *sets(*TINY, shared_tracking, *short, *two)]  # fmt: skip
    result = subprocess.run(cmd, env=child_env(isolated_runs), cwd=REPO, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 process(es) on cpu" in result.stderr and "global batch 8 x 64 tokens" in result.stderr
    a, b = losses(isolated_runs / "one"), losses(isolated_runs / "two")
    assert sorted(a) == sorted(b) == list(range(1, 21))
    assert a[1] == pytest.approx(b[1], abs=1e-5), "the same initial weights and the same first batch"
    assert max(abs(a[s] - b[s]) for s in a) < 2e-3, {s: (a[s], b[s]) for s in a}
    va, vb = val_losses(isolated_runs / "one"), val_losses(isolated_runs / "two")
    assert va.keys() == vb.keys() and max(abs(va[s] - vb[s]) for s in va) < 2e-3, (va, vb)
    assert va[20] < 0.7 * va[0], "and both learn"
    manifest = json.loads((isolated_runs / "two" / "pretrain" / "manifest.json").read_text())
    assert manifest["status"] == "complete" and (isolated_runs / "two" / "pretrain" / "model" / "config.json").is_file()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_stage_rerun_after_failure_resumes_from_the_checkpoint(tiny_run, isolated_runs, monkeypatch):
    """A NaN stops the run cleanly; a re-run of the failed stage resumes from the last good checkpoint."""
    import pretrain.train as train_mod

    cfg = tiny_run("nan")
    real = train_mod.compute_loss
    calls = {"n": 0}

    def poisoned(model, x, y):
        calls["n"] += 1
        loss = real(model, x, y)
        return loss * float("nan") if calls["n"] == 25 else loss

    monkeypatch.setattr(train_mod, "compute_loss", poisoned)
    with pytest.raises(Diverged, match=r"diverged at step 25: loss is nan .* last good checkpoint is step-0000020"):
        train_mod.run(cfg)
    out = isolated_runs / "nan" / "pretrain"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "diverged at step 25" in manifest["error"]
    assert [s for s, _ in ckpt.list_checkpoints(out / "checkpoints")] == [10, 20]
    assert max(losses(isolated_runs / "nan")) == 24, "the NaN step is neither applied nor logged"
    before = losses(isolated_runs / "nan")

    monkeypatch.setattr(train_mod, "compute_loss", real)
    # a checkpoint of the whole-tensor format before sharded checkpoints is refused before anything is loaded
    state_file = out / "checkpoints" / "step-0000020" / "state.json"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({k: v for k, v in state.items() if k != "format"}))
    with pytest.raises(ForgeError, match=r"step-0000020 is in another checkpoint format .*re-run with --force"):
        train_mod.run(cfg)
    state_file.write_text(json.dumps(state))
    manifest = train_mod.run(cfg)
    assert manifest["status"] == "complete" and manifest["metrics"]["resumed_from_step"] == 20
    after = losses(isolated_runs / "nan")
    assert after[20] == before[20] and sorted(after) == list(range(1, 41))
    assert all(math.isfinite(v) for v in after.values())


@pytest.mark.slow
def test_too_high_learning_rate_raises_the_val_rise_flag_and_stops_early(tiny_run, isolated_runs, caplog):
    from pretrain.train import run

    high = tiny_run("high", "train.lr=1.0", "train.warmup_steps=0", "train.eval_every=4", "train.max_steps=60",
                    "train.val_rise_patience=3", "train.stop_on_val_rise=true")  # fmt: skip
    with caplog.at_level("WARNING", logger="forge.pretrain"):
        m = run(high)["metrics"]
    assert m["val_rise_flags"] >= 1 and m["stopped_early"] == 1.0 and m["steps"] < 60
    assert "val perplexity" in caplog.text and "learning rate is too high" in caplog.text
    assert m["best_val_loss"] < m["final_val_loss"]
    best = json.loads((isolated_runs / "high" / "pretrain" / "model" / "forge_pretrain.json").read_text())
    assert best["best_step"] == m["best_step"], "the export is the best checkpoint, not the last"

    normal = run(tiny_run("normal", "train.precision=bf16"))  # bf16 autocast works on CPU too
    assert normal["metrics"]["val_rise_flags"] == 0 and normal["metrics"]["stopped_early"] == 0.0
    assert normal["metrics"]["final_val_loss"] < 0.7 * normal["metrics"]["initial_val_loss"]


def test_fp16_on_cpu_is_refused_with_the_fix(tiny_run):
    from pretrain.train import run

    with pytest.raises(ForgeError, match="train.precision=fp16 needs a CUDA GPU"):
        run(tiny_run("fp16", "train.precision=fp16"))


def test_missing_tokenizer_stage_names_the_fix(isolated_runs):
    from pretrain.train import run

    with pytest.raises(ForgeError, match="tokenizer has not run .*run `forge tokenizer` with the same --config"):
        run(load_config(None, ["run_name=nothing"]))
