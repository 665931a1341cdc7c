"""`forge pretrain` on 2 processes through torchrun with a c10d rendezvous: the multi-node launch of the README
(`--nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT`) with one node, on the CPU over gloo.

Data parallelism (DDP), not FSDP: Accelerate 1.16 turns FSDP on only for GPU-like devices (a CPU run stays
MULTI_CPU, i.e. DDP, even with --use_fsdp), and `forge pretrain` refuses FSDP rather than write sharded
checkpoints it cannot resume (see pretrain/train.py's make_accelerator).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_pretrain import (  # noqa: F401 - fixtures
    REPO,
    TINY,
    _free_port,
    child_env,
    losses,
    sets,
    shared_tracking,
    synthetic_tokenizer_dir,
    tiny_run,
    val_losses,
)


@pytest.mark.slow  # ~40-70 s on 2 busy cores
def test_two_process_data_parallel_through_torchrun_rendezvous(tiny_run, isolated_runs, shared_tracking):  # noqa: F811
    tiny_run("rdzv")  # places the synthetic tokenizer and shards under runs/rdzv/
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    short = ("run_name=rdzv", "train.max_steps=12", "train.eval_every=6", "train.checkpoint_every=6",
             "train.micro_batch_size=4")  # fmt: skip
    cmd = [torchrun, "--nnodes", "1", "--nproc_per_node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
           f"127.0.0.1:{_free_port()}", "--rdzv-id", "forge-test", "-m", "forge.cli", "pretrain",
           *sets(*TINY, shared_tracking, *short)]  # fmt: skip
    start = time.time()
    result = subprocess.run(cmd, env=child_env(isolated_runs), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    print(f"torchrun 2 x cpu: {time.time() - start:.1f} s")
    assert "2 process(es) on cpu" in result.stderr and "global batch 8 x 64 tokens" in result.stderr
    out = isolated_runs / "rdzv" / "pretrain"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["metrics"]["steps"] == 12
    assert sorted(losses(isolated_runs / "rdzv")) == list(range(1, 13)), "the main process alone logs each step"
    vals = val_losses(isolated_runs / "rdzv")
    assert sorted(vals) == [0, 6, 12] and vals[12] < vals[0]
    state = json.loads((out / "checkpoints" / "step-0000012" / "state.json").read_text())
    assert state["world_size"] == 2
    assert (out / "model" / "model.safetensors").is_file()
