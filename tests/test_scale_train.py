"""`forge pretrain` on 2 processes through torchrun with a c10d rendezvous: the multi-node launch of the README
(`--nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT`) with one node, on the CPU over gloo.

Data-parallel (train.sharding=ddp) and sharded (train.sharding=fsdp: PyTorch FSDP2 on the process group Accelerate
sets up, see pretrain/sharding.py). The sharded run must follow the DDP run step by step, hold half of the
parameters in each process, write whole tensors (checkpoints and the export) and, killed after a checkpoint,
resume to exactly the losses of its uninterrupted twin; bf16 and gradient checkpointing work under it.

Two nodes on one machine: two torchrun agents (`--nnodes 2 --nproc_per_node 1`) meet at one c10d rendezvous on
127.0.0.1 and share the runs directory, as two machines share it over NFS. Both killed after a checkpoint, the run
resumes on two agents to the uninterrupted run's losses, and is refused on one process with the numbers.

The DDP and FSDP runs are module fixtures: each is launched once and compared by several tests.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from test_pretrain import (  # noqa: F401 - fixtures
    REPO,
    TINY,
    _free_port,
    child_env,
    forge_cmd,
    losses,
    sets,
    shared_tracking,
    synthetic_tokenizer_dir,
    val_losses,
)

from pretrain import checkpoint as ckpt

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)

# 2 windows x 2 accumulation steps x 2 processes: gradient accumulation runs under both shardings
SHORT = ("train.max_steps=12", "train.eval_every=6", "train.checkpoint_every=6", "train.micro_batch_size=2",
         "train.grad_accum_steps=2")  # fmt: skip


@dataclass
class Torchrun:
    """2-process `forge pretrain` runs of the synthetic corpus under one runs directory."""

    runs: Path
    tokenizer: Path
    tracking: str

    def command(self, name: str, *overrides: str, nodes: int = 1, port: int = 0) -> list[str]:
        """The command line of one node of run `name`: 2 processes on one node, or 1 on each of `nodes` nodes that
        meet at 127.0.0.1:`port` (a fresh port by default); places the run's tokenizer stage."""
        if not (self.runs / name / "tokenizer").exists():
            shutil.copytree(self.tokenizer, self.runs / name / "tokenizer")
        exe = str(Path(sys.executable).with_name("torchrun"))
        per_node = 2 if nodes == 1 else 1
        endpoint = f"127.0.0.1:{port or _free_port()}"
        return [exe, "--nnodes", str(nodes), "--nproc_per_node", str(per_node), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", endpoint, "--rdzv-id", f"forge-{name}", "-m", "forge.cli", "pretrain",
                *sets(*TINY, self.tracking, *SHORT, f"run_name={name}", *overrides)]  # fmt: skip

    def node_commands(self, name: str, *overrides: str) -> list[list[str]]:
        """Two nodes of one process each: the same command on both (c10d numbers the nodes as they arrive; the
        first to bind the port hosts the rendezvous store, the other joins it)."""
        port = _free_port()
        return [self.command(name, *overrides, nodes=2, port=port) for _ in range(2)]

    def start_nodes(self, name: str, *overrides: str) -> list[subprocess.Popen]:
        """Both agents of a two-node run, started at once; each writes its stderr to runs/<name>-node<i>.log."""
        env = child_env(self.runs)
        agents = []
        for i, cmd in enumerate(self.node_commands(name, *overrides)):
            with (self.runs / f"{name}-node{i}.log").open("a") as log:  # a file, not a pipe nobody reads
                agents.append(subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log))
        return agents

    def node_logs(self, name: str) -> str:
        return "".join((self.runs / f"{name}-node{i}.log").read_text() for i in range(2))

    def run(self, name: str, *overrides: str) -> tuple[Path, str]:
        """Run to completion; the run's directory and the processes' stderr."""
        start = time.time()
        result = subprocess.run(self.command(name, *overrides), env=child_env(self.runs), cwd=REPO,
                                capture_output=True, text=True, timeout=300)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        print(f"torchrun 2 x cpu, {name}: {time.time() - start:.1f} s")
        return self.runs / name, result.stderr


@pytest.fixture(scope="module")
def torchrun(tmp_path_factory, synthetic_tokenizer_dir, shared_tracking) -> Torchrun:  # noqa: F811
    return Torchrun(tmp_path_factory.mktemp("scale") / "runs", synthetic_tokenizer_dir, shared_tracking)


@pytest.fixture(scope="module")
def ddp_run(torchrun):
    return torchrun.run("ddp")


@pytest.fixture(scope="module")
def fsdp_run(torchrun):
    return torchrun.run("fsdp", "train.sharding=fsdp")


def kill_after_first_checkpoint(agents: list[subprocess.Popen], run: Path) -> None:
    """SIGKILL the agents and their workers (the nodes die) once the run has a checkpoint, and check that the kill
    landed before the run completed. The workers are killed one by one: torchrun starts each in a session of its
    own, so a signal to the agent's process group would miss them."""
    import psutil

    deadline = time.time() + 240
    while not ckpt.list_checkpoints(run / "pretrain" / "checkpoints") and time.time() < deadline:
        assert all(agent.poll() is None for agent in agents), "a node ended before the first checkpoint"
        time.sleep(0.02)
    workers = [w for agent in agents for w in psutil.Process(agent.pid).children(recursive=True)]
    for proc in [*workers, *(psutil.Process(agent.pid) for agent in agents)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    for agent in agents:
        agent.wait()
    psutil.wait_procs(workers, timeout=30)
    manifest = json.loads((run / "pretrain" / "manifest.json").read_text())
    assert manifest["status"] == "running" and max(losses(run)) < 12, "the kill must land before the run completed"


def held(stderr: str, sharding: str) -> list[float]:
    """The parameters each process holds, from the line the main process logs."""
    match = re.search(rf"pretrain: {sharding}, parameters held per process: ([\d,/ ]+)", stderr)
    assert match, stderr[-3000:]
    return [float(n.replace(",", "")) for n in match.group(1).split(" / ")]


def parameters(run: Path) -> float:
    return json.loads((run / "pretrain" / "manifest.json").read_text())["metrics"]["parameters"]


@pytest.mark.slow  # ~20-40 s on 2 busy cores
def test_two_process_data_parallel_through_torchrun_rendezvous(ddp_run):
    run, stderr = ddp_run
    assert "2 process(es) on cpu" in stderr and "global batch 8 x 64 tokens" in stderr
    assert held(stderr, "unsharded") == [parameters(run)] * 2
    out = run / "pretrain"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["metrics"]["steps"] == 12
    assert sorted(losses(run)) == list(range(1, 13)), "the main process alone logs each step"
    vals = val_losses(run)
    assert sorted(vals) == [0, 6, 12] and vals[12] < vals[0]
    state = json.loads((out / "checkpoints" / "step-0000012" / "state.json").read_text())
    assert state["world_size"] == 2 and state["sharding"] == "ddp"
    assert (out / "model" / "model.safetensors").is_file()


@pytest.mark.slow  # ~20-40 s on 2 busy cores
def test_fsdp_shards_the_model_and_follows_the_ddp_run(ddp_run, fsdp_run):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    (ddp, _), (fsdp, stderr) = ddp_run, fsdp_run
    assert "2 process(es) on cpu" in stderr and "global batch 8 x 64 tokens" in stderr
    assert held(stderr, "FSDP") == [parameters(fsdp) / 2] * 2, "each process holds half (every dim 0 here is even)"
    a, b = losses(ddp), losses(fsdp)
    assert sorted(a) == sorted(b) == list(range(1, 13))
    # the same batches and the same math; only the order of the float sums differs (a reduce-scatter per
    # micro-batch against one all-reduce per step). Measured: 11 of 12 losses bit-equal, one 4.8e-7 apart (one
    # float32 ulp at 4.7); val losses 6e-8. 1e-5 is ~20 ulps: room for another CPU's kernels, not for a bug.
    assert max(abs(a[s] - b[s]) for s in a) < 1e-5, {s: (a[s], b[s]) for s in a}
    va, vb = val_losses(ddp), val_losses(fsdp)
    assert va.keys() == vb.keys() and max(abs(va[s] - vb[s]) for s in va) < 1e-5, (va, vb)

    # whole tensors on disk: the checkpoint's model and optimizer tensors have the DDP run's names and shapes
    for name in ("model.safetensors", "optimizer.safetensors"):
        d, f = (load_file(run / "pretrain" / "checkpoints" / "step-0000012" / name) for run in (ddp, fsdp))
        assert {k: v.shape for k, v in d.items()} == {k: v.shape for k, v in f.items()}, name
    state = json.loads((fsdp / "pretrain" / "checkpoints" / "step-0000012" / "state.json").read_text())
    assert state["world_size"] == 2 and state["sharding"] == "fsdp"

    # the export loads with transformers and computes what the DDP run's export computes
    ids = torch.arange(3, 67).unsqueeze(0)
    with torch.no_grad():
        logits = [AutoModelForCausalLM.from_pretrained(run / "pretrain" / "model")(ids).logits for run in (ddp, fsdp)]
    assert (logits[0] - logits[1]).abs().max() < 1e-5  # measured 8.9e-7


@pytest.mark.slow  # ~35-50 s on 2 busy cores: two launches
def test_fsdp_killed_after_a_checkpoint_resumes_exactly(torchrun, fsdp_run):
    """Both processes SIGKILLed (the node dies) after the first checkpoint, then the same command again: every
    step has the uninterrupted FSDP run's loss, to the bit (the shards are cut again from the whole checkpoint)."""
    run = torchrun.runs / "killed"
    env = child_env(torchrun.runs)
    agent = subprocess.Popen(torchrun.command("killed", "train.sharding=fsdp"), env=env, cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    kill_after_first_checkpoint([agent], run)

    result = subprocess.run(torchrun.command("killed", "train.sharding=fsdp"), env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"resumed from \S+step-0000006 \(step 6 of 12", result.stderr), result.stderr[-3000:]
    straight = fsdp_run[0]
    assert losses(run) == losses(straight), "on CPU the resumed run is bit-identical"
    assert val_losses(run) == val_losses(straight)


@pytest.mark.slow  # ~20-30 s on 2 busy cores
def test_fsdp_in_bf16_with_gradient_checkpointing(torchrun, fsdp_run):
    """bf16 under FSDP: the gathered weights are bf16 (MixedPrecisionPolicy), the shards and so the checkpoint fp32;
    each decoder layer is recomputed in the backward (gradient checkpointing inside the FSDP units)."""
    from safetensors.torch import load_file

    short = ("train.max_steps=6", "train.checkpoint_every=6", "train.precision=bf16",
             "train.gradient_checkpointing=true", "train.sharding=fsdp")  # fmt: skip
    run, stderr = torchrun.run("bf16", *short)
    assert "2 process(es) on cpu, bf16" in stderr
    a, b = losses(fsdp_run[0]), losses(run)
    diff = max(abs(a[s] - b[s]) for s in b)
    # bf16 matmuls against the fp32 run's first 6 steps (the same learning rates up to step 6): measured 1.4e-3
    assert sorted(b) == list(range(1, 7)) and 0 < diff < 1e-2, (a, b)
    weights = load_file(run / "pretrain" / "checkpoints" / "step-0000006" / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.float32}, "the fp32 master weights, whole"


@pytest.mark.slow  # ~45-60 s on 2 busy cores (two two-node launches and a refused one), +~23 s for ddp_run
def test_two_nodes_killed_resume_on_two_and_are_refused_on_one(torchrun, ddp_run):
    """Two torchrun agents of one process each (two nodes on 127.0.0.1, one shared runs directory), both SIGKILLed
    after the first checkpoint. Resumed on one process, the run is refused with the numbers and the fix, and left
    as it was; resumed on two agents, it finishes with the uninterrupted one-node run's losses, to the bit."""
    run = torchrun.runs / "nodes"
    kill_after_first_checkpoint(torchrun.start_nodes("nodes"), run)
    checkpoints = ckpt.list_checkpoints(run / "pretrain" / "checkpoints")
    assert [step for step, _ in checkpoints] == [6]
    assert json.loads((checkpoints[0][1] / "state.json").read_text())["world_size"] == 2
    before = losses(run)

    command = forge_cmd(*sets(*TINY, torchrun.tracking, *SHORT, "run_name=nodes"))
    one = subprocess.run(command, env=child_env(torchrun.runs), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert one.returncode == 2 and "Traceback" not in one.stderr, one.stderr[-3000:]
    refusal = one.stderr.strip().splitlines()[-1]
    assert refusal.startswith("error: pretrain: ") and "step-0000006 was written by 2 process(es)" in refusal
    assert "a global batch of 8 sequences (2 x train.micro_batch_size 2 x train.grad_accum_steps 2)" in refusal
    assert "resumed on 1 it would train on 4 a step" in refusal
    assert "Resume it on 2 process(es)" in refusal and "--force" in refusal
    assert ckpt.list_checkpoints(run / "pretrain" / "checkpoints") == checkpoints and losses(run) == before

    agents = torchrun.start_nodes("nodes")
    assert [agent.wait(timeout=300) for agent in agents] == [0, 0], torchrun.node_logs("nodes")[-3000:]
    logs = torchrun.node_logs("nodes")
    assert "2 process(es) on cpu" in logs and "global batch 8 x 64 tokens" in logs
    assert re.search(r"resumed from \S+step-0000006 \(step 6 of 12", logs), logs[-3000:]
    manifest = json.loads((run / "pretrain" / "manifest.json").read_text())
    assert manifest["status"] == "complete" and (run / "pretrain" / "model" / "model.safetensors").is_file()
    straight = ddp_run[0]
    assert losses(run) == losses(straight), "two nodes of one process run what one node of two runs, resumed or not"
    assert val_losses(run) == val_losses(straight)
