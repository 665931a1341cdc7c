"""`forge pretrain` on 2 processes through torchrun with a c10d rendezvous: the multi-node launch of the README
(`--nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT`) with one node, on the CPU over gloo.

Data-parallel (train.sharding=ddp) and sharded (train.sharding=fsdp: PyTorch FSDP2 on the process group Accelerate
sets up, see pretrain/sharding.py). The sharded run must follow the DDP run step by step, hold half of the
parameters in each process, write half of each tensor of its checkpoints in each process (whole tensors only in the
export) and, killed after a checkpoint, resume to exactly the losses of its uninterrupted twin; a checkpoint of
either sharding resumes under the other; bf16 and gradient checkpointing work under it.

Two nodes on one machine: two torchrun agents (`--nnodes 2 --nproc_per_node 1`) meet at one c10d rendezvous on
127.0.0.1 and share the runs directory, as two machines share it over NFS. Both killed after a checkpoint, the run
resumes on two agents to the uninterrupted run's losses, and on one process with twice the accumulation steps (the
same global batch) to within float summation order.

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
from test_checkpoint import assert_no_pickle
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


def shard_files(checkpoint: Path) -> list[dict[str, torch.Tensor]]:
    """The tensors of each process's shard file of a checkpoint, in process order."""
    from safetensors.torch import load_file

    return [load_file(path) for path in sorted((checkpoint / "tensors").glob("shard-*.safetensors"))]


def resumable_copy(run: Path, name: str, step: int) -> Path:
    """A copy of a finished run as if it had been killed after checkpoint `step`: the later checkpoints gone, the
    manifest not complete (the stage's settings and inputs are the same: the copy resumes)."""
    copy = run.parent / name
    shutil.copytree(run, copy)
    for later, path in ckpt.list_checkpoints(copy / "pretrain" / "checkpoints"):
        if later > step:
            shutil.rmtree(path)
    manifest = json.loads((copy / "pretrain" / "manifest.json").read_text())
    (copy / "pretrain" / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    return copy


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

    # sharded on disk, one file per process: the DDP run wrote each tensor once, whole, in one of them; the FSDP
    # run half of each (dim 0) in each, but a replicated 0-dim AdamW step once. The same names and whole shapes.
    d, f = (shard_files(run / "pretrain" / "checkpoints" / "step-0000012") for run in (ddp, fsdp))
    assert len(d) == len(f) == 2 and not set(d[0]) & set(d[1]) and set(f[0]) | set(f[1]) == set(d[0]) | set(d[1])
    whole = {k: v.shape for file in d for k, v in file.items()}
    assert any(k.startswith("optim.") and k.endswith(".exp_avg_sq") for k in whole)
    for name, shape in whole.items():
        pieces = [file[name].shape for file in f if name in file]
        assert pieces == ([shape] if len(shape) == 0 else [(shape[0] // 2, *shape[1:])] * 2), name
    state = json.loads((fsdp / "pretrain" / "checkpoints" / "step-0000012" / "state.json").read_text())
    assert state["world_size"] == 2 and state["sharding"] == "fsdp"
    for run in (ddp, fsdp):
        assert_no_pickle(run / "pretrain" / "checkpoints")

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


@pytest.mark.slow  # ~20-30 s on 2 busy cores each (one launch), +~23 s for each fixture run
@pytest.mark.parametrize("written, resumed", [("ddp", "fsdp"), ("fsdp", "ddp")])
def test_a_checkpoint_resumes_under_the_other_sharding(torchrun, request, written, resumed):
    """The DDP run's step-6 checkpoint resumed under FSDP (each process reads the halves it holds of the whole
    tensors one process wrote), and the FSDP run's under DDP (each process reads both halves): the run continues
    to the losses of the uninterrupted run of either sharding, within float summation order."""
    runs = {"ddp": request.getfixturevalue("ddp_run")[0], "fsdp": request.getfixturevalue("fsdp_run")[0]}
    name = f"{written}-to-{resumed}"
    run = resumable_copy(runs[written], name, step=6)
    _, stderr = torchrun.run(name, f"train.sharding={resumed}")
    assert re.search(r"resumed from \S+step-0000006 \(step 6 of 12", stderr), stderr[-3000:]
    assert ("pretrain: FSDP, parameters held" in stderr) == (resumed == "fsdp")
    state = json.loads((run / "pretrain" / "checkpoints" / "step-0000012" / "state.json").read_text())
    assert state["sharding"] == resumed and state["world_size"] == 2
    after = losses(run)
    assert sorted(after) == list(range(1, 13))
    for straight in (written, resumed):
        reference = losses(runs[straight])
        diff = max(abs(after[s] - reference[s]) for s in range(7, 13))
        print(f"{name}: steps 7-12 against the uninterrupted {straight} run: {diff:.3g}")
        # measured: 4.8e-7 at most (one float32 ulp at 4.7, what the DDP and FSDP runs differ by themselves); the
        # FSDP checkpoint resumed under DDP has the FSDP run's losses to the bit. 1e-5: room for another CPU's kernels
        assert diff < 1e-5, (after, reference)
        va, vb = val_losses(run), val_losses(runs[straight])
        assert va.keys() == vb.keys() and max(abs(va[s] - vb[s]) for s in va) < 1e-5, (va, vb)


@pytest.mark.slow  # ~20-30 s on 2 busy cores
def test_fsdp_in_bf16_with_gradient_checkpointing(torchrun, fsdp_run):
    """bf16 under FSDP: the gathered weights are bf16 (MixedPrecisionPolicy), the shards and so the checkpoint fp32;
    each decoder layer is recomputed in the backward (gradient checkpointing inside the FSDP units)."""
    short = ("train.max_steps=6", "train.checkpoint_every=6", "train.precision=bf16",
             "train.gradient_checkpointing=true", "train.sharding=fsdp")  # fmt: skip
    run, stderr = torchrun.run("bf16", *short)
    assert "2 process(es) on cpu, bf16" in stderr
    a, b = losses(fsdp_run[0]), losses(run)
    diff = max(abs(a[s] - b[s]) for s in b)
    # bf16 matmuls against the fp32 run's first 6 steps (the same learning rates up to step 6): measured 1.4e-3
    assert sorted(b) == list(range(1, 7)) and 0 < diff < 1e-2, (a, b)
    files = shard_files(run / "pretrain" / "checkpoints" / "step-0000006")
    dtypes = {t.dtype for file in files for name, t in file.items() if name.startswith("model.")}
    assert len(files) == 2 and dtypes == {torch.float32}, "the fp32 master weights, a shard in each process's file"


@pytest.mark.slow  # ~50-65 s on 2 busy cores (two two-node launches and a one-process one), +~23 s for ddp_run
def test_two_nodes_killed_resume_on_two_and_on_one_with_the_same_global_batch(torchrun, ddp_run):
    """Two torchrun agents of one process each (two nodes on 127.0.0.1, one shared runs directory), both SIGKILLed
    after the first checkpoint. Resumed on one process (a copy of the run), it continues with train.grad_accum_steps
    doubled, the same global batch, to the uninterrupted run's losses within float summation order; resumed on two
    agents, it finishes with the uninterrupted one-node run's losses, to the bit."""
    run = torchrun.runs / "nodes"
    kill_after_first_checkpoint(torchrun.start_nodes("nodes"), run)
    checkpoints = ckpt.list_checkpoints(run / "pretrain" / "checkpoints")
    assert [step for step, _ in checkpoints] == [6]
    written = json.loads((checkpoints[0][1] / "state.json").read_text())
    assert (written["world_size"], written["grad_accum_steps"], written["global_batch"]) == (2, 2, 8)
    straight = ddp_run[0]

    one = resumable_copy(run, "nodes-on-one", step=6)
    command = forge_cmd(*sets(*TINY, torchrun.tracking, *SHORT, "run_name=nodes-on-one"))
    result = subprocess.run(command, env=child_env(torchrun.runs), cwd=REPO, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "step-0000006 was written by 2 process(es) x train.micro_batch_size 2 x train.grad_accum_steps 2, a global "
        "batch of 8; resumed on 1 with train.grad_accum_steps 4 to keep it" in result.stderr
    ), result.stderr[-3000:]
    assert "dropout RNG cannot continue exactly" in result.stderr
    assert "1 process(es) on cpu" in result.stderr and "global batch 8 x 64 tokens" in result.stderr
    state = json.loads((one / "pretrain" / "checkpoints" / "step-0000012" / "state.json").read_text())
    assert (state["world_size"], state["grad_accum_steps"], state["global_batch"]) == (1, 4, 8)
    a, b = losses(one), losses(straight)
    assert sorted(a) == list(range(1, 13)) and all(a[s] == b[s] for s in range(1, 7))
    diff = max(abs(a[s] - b[s]) for s in range(7, 13))
    print(f"nodes resumed on one process: steps 7-12 against the uninterrupted run: {diff:.3g}")
    assert diff < 1e-5, (a, b)  # measured 4.8e-7: one float32 ulp at 4.7 (4 micro-batches summed in another order)
    va, vb = val_losses(one), val_losses(straight)
    assert va.keys() == vb.keys() and max(abs(va[s] - vb[s]) for s in va) < 1e-5, (va, vb)

    agents = torchrun.start_nodes("nodes")
    assert [agent.wait(timeout=300) for agent in agents] == [0, 0], torchrun.node_logs("nodes")[-3000:]
    logs = torchrun.node_logs("nodes")
    assert "2 process(es) on cpu" in logs and "global batch 8 x 64 tokens" in logs
    assert re.search(r"resumed from \S+step-0000006 \(step 6 of 12", logs), logs[-3000:]
    manifest = json.loads((run / "pretrain" / "manifest.json").read_text())
    assert manifest["status"] == "complete" and (run / "pretrain" / "model" / "model.safetensors").is_file()
    assert losses(run) == losses(straight), "two nodes of one process run what one node of two runs, resumed or not"
    assert val_losses(run) == val_losses(straight)
