"""The GPU check in one call: training throughput and MFU (bf16, then torch.compile), a demo model trained for a
minute, bitsandbytes 8/4-bit loading and perplexity against bf16, and vLLM serving that model under the load bench;
one JSON of results. Run it through bench/gpu_check.sh, which picks the python:

    bash bench/gpu_check.sh --out $OUT/gpu_check.json                  # a GPU machine: about 5-7 minutes
    bash bench/gpu_check.sh --wheels build/gpu-wheels --no-registry --no-vllm-install --out $OUT/gpu_check.json
    bash bench/gpu_check.sh --dry-run --out /tmp/gpu_check.json        # CPU: tiny shapes, a few steps, no installs

Every part runs in a child process of its own with its own timeout, clamped to what is left of --budget (450 s);
a part that fails or times out is recorded with the end of its log and the next one runs. The JSON is rewritten
(temp file, then rename) after every part, so an interrupted run still leaves what it measured.

Parts (figures in the JSON under parts.NAME.figures):
  environment     GPU name, driver, CUDA, torch and library versions
  train_bf16      configs/125m.yaml with random tokens: the plain PyTorch loop of bench/train_throughput.py
                  (tokens/s, MFU against pretrain/hardware.py's peak, peak GPU memory), then Forge's own loop
                  (pretrain.train.run) where MLflow is installed, and their ratio
  train_compile   the same plain loop with torch.compile (inductor; the eager backend in the dry run): tokens/s,
                  MFU, the speedup over train_bf16, the seconds spent before the timed steps (the compile)
  demo_model      no weights can be downloaded, so the demo-sized model is made here: Forge's BPE tokenizer and the
                  125M shape trained for --demo-train-seconds on the running Python's standard-library sources,
                  saved as safetensors with its tokenizer and chat template
  bnb             that model loaded in bf16, 8-bit and 4-bit NF4 (double quant, bf16 compute) through transformers'
                  BitsAndBytesConfig: memory footprint, load seconds, perplexity on held-out sources, ratio to bf16
  vllm            that model served by vLLM (serve.backends.vllm_command, behind nothing), the load bench of
                  bench/serve_load.py at --vllm-concurrency: requests/s, tokens/s, p50/p95 latency

Installs (never in the dry run): packages the parts import that are missing go in from --wheels DIR (offline), else
from the registry at requirements.lock's versions; torch==2.13.0 where there is no torch. vLLM pins its own torch,
so it gets a venv of its own from docker/requirements-serve-gpu.lock, built in the background while the training
parts run; $FORGE_VLLM_PYTHON (a python that imports vllm) skips that. A machine that reaches no registry gets the
small packages as wheels (`bash bench/gpu_check.sh --download-wheels build/gpu-wheels` where pip works); vLLM's
several GB do not fit in such a carry, and that part is then recorded as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = "forge-gpu-check/1"
PARTS = ("environment", "train_bf16", "train_compile", "demo_model", "bnb", "vllm")
TIMEOUTS = {"environment": 60, "train_bf16": 150, "train_compile": 200, "demo_model": 150, "bnb": 120, "vllm": 240}
# What the parts import, by module, and the package (at requirements.lock's version) that provides it.
NEEDED = {"pydantic": "pydantic", "yaml": "pyyaml", "numpy": "numpy", "tokenizers": "tokenizers",
          "transformers": "transformers", "accelerate": "accelerate", "safetensors": "safetensors",
          "tqdm": "tqdm", "psutil": "psutil", "xxhash": "xxhash", "pyarrow": "pyarrow",
          "bitsandbytes": "bitsandbytes", "openai": "openai", "mlflow": "mlflow"}  # fmt: skip
# --download-wheels: what a GPU image with torch, transformers and accelerate but no registry lacks
WHEELS = ["pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions", "bitsandbytes"]
TORCH_SPEC = "torch==2.13.0"  # a CUDA build from PyPI on a GPU machine (Makefile's TORCH_SPEC)
VLLM_VENV = Path(tempfile.gettempdir()) / "forge-gpu-check-vllm"
# The dry run's model: tiny-cpu's size in configs/125m.yaml's architecture (GPT-2: Conv1D layers, which bitsandbytes
# quantizes by another path than nn.Linear), so the CPU rehearsal runs the code the GPU will.
DRY_RUN_SHAPE = ["model.architecture=gpt2", "model.activation=gelu_new", "model.context_length=128"]


def shapes(dry_run: bool) -> dict[str, Any]:
    """The sizes of every part: the real ones, or the dry run's (tiny, a few steps, everything on CPU)."""
    if dry_run:
        return {"config": "configs/tiny-cpu.yaml", "set": DRY_RUN_SHAPE, "steps": 6, "warmup": 2,
                "compile_backend": "eager", "corpus_bytes": 300_000, "demo_vocab": 512, "demo_train_seconds": 5,
                "eval_windows": 4, "vllm_requests": 8}  # fmt: skip
    return {"config": "configs/125m.yaml", "set": [], "steps": 30, "warmup": 10, "compile_backend": "inductor",
            "corpus_bytes": 12_000_000, "demo_vocab": 8192, "demo_train_seconds": 45, "eval_windows": 64,
            "vllm_requests": 128}  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# the parts, each run in a child process: `python bench/gpu_check.py --part NAME --settings FILE --result FILE`


def part_environment(s: dict[str, Any]) -> dict[str, Any]:
    import torch

    figures: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                               "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}  # fmt: skip
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        figures.update(gpu=torch.cuda.get_device_name(0), gpu_memory_gb=round(props.total_memory / 1e9, 1),
                       compute_capability=f"{props.major}.{props.minor}")  # fmt: skip
        figures["driver"] = _nvidia_smi("driver_version")
    from importlib.metadata import PackageNotFoundError, version

    for name in ("transformers", "accelerate", "bitsandbytes", "tokenizers", "mlflow", "triton", "vllm"):
        with contextlib.suppress(PackageNotFoundError):
            figures[name] = version(name)
    return figures


def _nvidia_smi(field: str) -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    query = ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    return None


def part_train(s: dict[str, Any], compile_backend: str | None) -> dict[str, Any]:
    """The plain loop's tokens/s, MFU and peak memory on random tokens; Forge's loop too when eager."""
    import torch
    from train_throughput import VOCAB_DEFAULT, forge_loop, plain_loop, write_synthetic_tokenizer_stage

    from forge.config import load_config
    from pretrain.hardware import flops_per_token, local_hardware, peak_flops, resolve_precision

    cfg = load_config(ROOT / s["config"], s["set"])
    vocab = cfg.model.vocab_size or cfg.tokenizer.vocab_size or VOCAB_DEFAULT
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"vocab_size": vocab})})
    t, steps, warmup = cfg.train, s["steps"], s["warmup"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    precision = resolve_precision(t.precision, local_hardware())
    runs = Path(s["work"]) / ("train-compiled" if compile_backend else "train-eager")
    os.environ["FORGE_RUNS_DIR"] = str(runs)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    need = 4 * steps * t.micro_batch_size * t.grad_accum_steps * (cfg.model.context_length + 1)
    write_synthetic_tokenizer_stage(runs / "synthetic" / "tokenizer", vocab, max(need, 1_000_000), cfg.seed)
    train_bin = runs / "synthetic" / "tokenizer" / "shards" / "train.bin"
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    tps = plain_loop(cfg, train_bin, vocab, steps, warmup, device, compile_backend=compile_backend)
    timed_s = (steps - warmup) * t.micro_batch_size * t.grad_accum_steps * cfg.model.context_length / tps
    mfu = flops_per_token(cfg.model, vocab) * tps / peak_flops(device, precision, cfg)
    figures: dict[str, Any] = {
        "model": f"{cfg.model.architecture} h{cfg.model.hidden_size} L{cfg.model.num_layers} "
        f"ctx{cfg.model.context_length} vocab {vocab}",
        "batch": f"micro {t.micro_batch_size} x accum {t.grad_accum_steps}", "precision": precision,
        "device": device, "steps_timed": steps - warmup, "tokens_per_s": round(tps), "mfu": round(mfu, 4),
        "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2) if device == "cuda" else None,
        "before_timed_steps_s": round(time.perf_counter() - start - timed_s, 1),
    }  # fmt: skip
    if compile_backend:
        figures["compile_backend"] = compile_backend
    elif importlib.util.find_spec("mlflow") is None:
        figures["forge_loop"] = "skipped: mlflow not installed (pretrain.train.run tracks every stage in MLflow)"
    else:
        forge = forge_loop(cfg, runs, steps, warmup, 0)
        figures.update(forge_tokens_per_s=round(forge), forge_over_plain=round(forge / tps, 3))
    return figures


def demo_corpus(limit: int) -> tuple[list[str], list[str]]:
    """The running Python's standard-library sources, in name order up to `limit` bytes: every 10th file held out."""
    import sysconfig

    train, held_out, total = [], [], 0
    for i, path in enumerate(sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))):
        text = path.read_text(encoding="utf-8", errors="replace")
        (held_out if i % 10 == 9 else train).append(text)
        total += len(text)
        if total >= limit:
            break
    return train, held_out


def part_demo_model(s: dict[str, Any]) -> dict[str, Any]:
    """Forge's tokenizer and the config's model shape, trained for demo_train_seconds and saved with both."""
    import numpy as np
    import torch

    from forge.config import TokenizerConfig, load_config
    from pretrain.model import build_model
    from pretrain.tokenizer import save_tokenizer, train_bpe

    cfg = load_config(ROOT / s["config"], s["set"])
    train_texts, _ = demo_corpus(s["corpus_bytes"])
    tcfg = TokenizerConfig(vocab_size=s["demo_vocab"])
    start = time.perf_counter()
    tok = train_bpe(train_texts, tcfg)
    tokenizer_s = time.perf_counter() - start
    dest = Path(s["work"]) / "demo-model"
    save_tokenizer(tok, tcfg, dest)
    ids = np.concatenate([np.array(e.ids, dtype=np.int64) for e in tok.encode_batch(train_texts)])
    vocab = tok.get_vocab_size()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, vocab).to(device)
    steps, loss = train_for(model, torch.from_numpy(ids), cfg, s["demo_train_seconds"], device)
    model.save_pretrained(dest)
    params = sum(p.numel() for p in model.parameters())
    return {"dir": str(dest), "vocab": vocab, "parameters_m": round(params / 1e6, 1), "train_tokens": int(ids.size),
            "tokenizer_s": round(tokenizer_s, 1), "steps": steps, "final_loss": round(loss, 3),
            "corpus": f"{len(train_texts)} stdlib .py files of Python {platform.python_version()}"}  # fmt: skip


def train_for(model: Any, ids: Any, cfg: Any, seconds: float, device: str) -> tuple[int, float]:
    """AdamW on random windows of `ids` until `seconds` have passed (bf16 autocast on a GPU): (steps, last loss)."""
    import torch
    import torch.nn.functional as F

    T, B = cfg.model.context_length, cfg.train.micro_batch_size * cfg.train.grad_accum_steps
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr * 2, weight_decay=0.1)
    model.train()
    gen = torch.Generator().manual_seed(cfg.seed)
    deadline, steps, loss = time.perf_counter() + seconds, 0, float("nan")
    while time.perf_counter() < deadline or steps == 0:
        ix = torch.randint(0, ids.numel() - T - 1, (B,), generator=gen)
        rows = torch.stack([ids[i : i + T + 1] for i in ix.tolist()]).to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = model(input_ids=rows[:, :-1], use_cache=False).logits
        out = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), rows[:, 1:].reshape(-1))
        out.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps, loss = steps + 1, out.item()
    model.eval()
    return steps, loss


def part_bnb(s: dict[str, Any]) -> dict[str, Any]:
    """The demo model in bf16, 8-bit and 4-bit NF4: footprint, load seconds, held-out perplexity and its ratio."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    model_dir = Path(s["demo_dir"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ctx = _context_length(s)
    _, held_out = demo_corpus(s["corpus_bytes"])
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = torch.tensor([i for text in held_out for i in tok(text)["input_ids"]][: s["eval_windows"] * ctx])
    windows = ids[: ids.numel() // ctx * ctx].view(-1, ctx)
    variants = {
        "bf16": None,
        "int8": BitsAndBytesConfig(load_in_8bit=True),
        "nf4": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                  bnb_4bit_compute_dtype=torch.bfloat16),
    }  # fmt: skip
    figures: dict[str, Any] = {"eval_tokens": int(windows.numel()), "context": ctx}
    for name, quant in variants.items():
        start = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, quantization_config=quant,
                                                     device_map={"": device})  # fmt: skip
        if device == "cuda":
            torch.cuda.synchronize()
        load_s = time.perf_counter() - start
        ppl = perplexity(model, windows, device)
        figures[name] = {"footprint_mb": round(model.get_memory_footprint() / 1e6, 1), "load_s": round(load_s, 2),
                         "perplexity": round(ppl, 3)}  # fmt: skip
        del model
    for name in ("int8", "nf4"):
        figures[name]["perplexity_ratio"] = round(figures[name]["perplexity"] / figures["bf16"]["perplexity"], 4)
        figures[name]["footprint_ratio"] = round(figures[name]["footprint_mb"] / figures["bf16"]["footprint_mb"], 3)
    return figures


def _context_length(s: dict[str, Any]) -> int:
    from forge.config import load_config

    return load_config(ROOT / s["config"], s["set"]).model.context_length


def perplexity(model: Any, windows: Any, device: str) -> float:
    import math

    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    with torch.no_grad():
        for row in windows.split(4):
            row = row.to(device)
            logits = model(input_ids=row, use_cache=False).logits.float()
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), row[:, 1:].reshape(-1), reduction="sum")
            total, count = total + loss.item(), count + row[:, 1:].numel()
    return math.exp(total / count)


def part_vllm(s: dict[str, Any]) -> dict[str, Any]:
    """vLLM on loopback serving the demo model; a warm-up, then the load bench at vllm_concurrency."""
    from serve_load import _free_port, load_test

    from serve.backends import ServerProcess, vllm_command

    model_dir, port, alias = Path(s["demo_dir"]), _free_port(), "forge-demo"
    cmd = vllm_command(model_dir, port, alias, max_model_len=_context_length(s), python=s["vllm_python"])
    log = Path(s["work"]) / "vllm-server.log"
    start = time.perf_counter()
    with ServerProcess(cmd, port, alias, log_path=log, ready_timeout=s["timeout"]) as server:
        ready_s = time.perf_counter() - start
        load_test(server.base_url, alias, n=8, concurrency=8, max_tokens=16)
        run = load_test(server.base_url, alias, n=s["vllm_requests"], concurrency=s["vllm_concurrency"],
                        max_tokens=s["vllm_max_tokens"])  # fmt: skip
    ok = run["requests"] - run["errors"]
    return {"server_ready_s": round(ready_s, 1), "requests_per_s": round(ok / run["wall_s"], 2), **run}


def run_part(name: str, settings_path: Path, result_path: Path) -> None:
    """The child process: one part, its figures written to result_path (a failure exits non-zero)."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))

    def stop(signum: int, frame: Any) -> None:  # the parent's timeout: unwind, so servers are stopped
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    s = json.loads(settings_path.read_text())
    parts = {"environment": part_environment, "train_bf16": lambda s: part_train(s, None),
             "train_compile": lambda s: part_train(s, s["compile_backend"]), "demo_model": part_demo_model,
             "bnb": part_bnb, "vllm": part_vllm}  # fmt: skip
    figures = parts[name](s)
    result_path.write_text(json.dumps(figures))


# ----------------------------------------------------------------------------------------------------------------
# the parent: installs, then each part in turn within the budget, the JSON rewritten after each


class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.started = args, time.monotonic()
        self.work = Path(tempfile.mkdtemp(prefix="forge-gpu-check-"))
        self.log = args.out.with_suffix(".log")
        self.settings = {**shapes(args.dry_run), "work": str(self.work), "vllm_concurrency": args.vllm_concurrency,
                         "vllm_max_tokens": args.vllm_max_tokens}  # fmt: skip
        if args.demo_train_seconds is not None:
            self.settings["demo_train_seconds"] = args.demo_train_seconds
        self.report: dict[str, Any] = {
            "schema": SCHEMA, "dry_run": args.dry_run, "python": sys.executable,
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "budget_s": args.budget, "settings": {k: v for k, v in self.settings.items() if k != "work"},
            "setup": {}, "environment": {}, "parts": {},
        }  # fmt: skip
        self.vllm_install: subprocess.Popen | None = None

    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.started)

    def write(self) -> None:
        self.report["seconds"] = round(time.monotonic() - self.started, 1)
        out = self.args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(self.report, indent=2) + "\n")
        os.replace(tmp, out)

    def record(self, name: str, status: str, seconds: float, figures: dict[str, Any], tail: str = "") -> None:
        entry: dict[str, Any] = {"status": status, "seconds": round(seconds, 1), "figures": figures}
        if tail:
            entry["log_tail"] = tail
        self.report["parts"][name] = entry
        if name == "environment":
            self.report["environment"] = figures
        print(f"[gpu_check] {name}: {status} in {seconds:.1f}s {json.dumps(figures)[:400]}", flush=True)
        self.write()

    def child(self, name: str, extra: dict[str, Any], timeout: float) -> tuple[str, dict[str, Any], str]:
        """Run one part in its own process group: (status, figures, log tail where it did not succeed)."""
        settings, result = self.work / f"{name}.settings.json", self.work / f"{name}.result.json"
        settings.write_text(json.dumps({**self.settings, **extra, "timeout": timeout}))
        cmd = [sys.executable, __file__, "--part", name, "--settings", str(settings), "--result", str(result)]
        with open(self.log, "a") as log:
            log.write(f"\n===== {name} (timeout {timeout:.0f}s) =====\n")
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _stop_group(proc)
                return f"timed out after {timeout:.0f}s", {}, _tail(self.log)
        if code != 0 or not result.is_file():
            return f"failed: {_last_error(self.log)}", {}, _tail(self.log)
        return "ok", json.loads(result.read_text()), ""

    def part(self, name: str, extra: dict[str, Any] | None = None, skip: str | None = None) -> dict[str, Any]:
        if skip is None and self.left() < 15:
            skip = f"the budget of {self.args.budget}s was spent"
        if skip is not None:
            self.record(name, f"skipped: {skip}", 0.0, {})
            return {}
        start = time.monotonic()
        status, figures, tail = self.child(name, extra or {}, min(TIMEOUTS[name], self.left() - 5))
        self.record(name, status, time.monotonic() - start, figures, tail)
        return figures if status == "ok" else {}


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the part's process group (the child unwinds and stops its servers), SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _last_error(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b", ln)]
    return (errors or lines or ["no output"])[-1][:300]


# ----------------------------------------------------------------------------------------------------------------
# installs (never in the dry run)


def lock_versions(lock: Path) -> dict[str, str]:
    """name -> version of every `name==version` line of a pip lock file (names lowercased, _ as -)."""
    found = re.findall(r"^([A-Za-z0-9_.-]+)==([^\s\\;]+)", lock.read_text(), re.M)
    return {name.lower().replace("_", "-"): version for name, version in found}


def missing_modules() -> list[str]:
    return [module for module in ["torch", *NEEDED] if importlib.util.find_spec(module) is None]


def pip(args: list[str], timeout: float) -> tuple[bool, str]:
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f}s"
    return done.returncode == 0, (done.stdout + done.stderr).strip()[-500:]


def setup(check: Check) -> None:
    """Install what is missing (--wheels DIR offline, else the registry), and start the vLLM venv's install."""
    start, a = time.monotonic(), check.args
    info: dict[str, Any] = {"missing_before": missing_modules()}
    if a.wheels:
        wheels = sorted(str(w) for w in Path(a.wheels).glob("*.whl"))
        info["wheels"] = [Path(w).name for w in wheels]
        ok, out = pip(["--no-index", "--no-deps", *wheels], 180) if wheels else (False, f"no wheels in {a.wheels}")
        info["wheels_installed"] = ok if ok else f"failed: {out}"
    missing = missing_modules()
    if missing and not a.no_registry:
        lock = lock_versions(ROOT / "requirements.lock")
        specs = [TORCH_SPEC if m == "torch" else f"{NEEDED[m]}=={lock[NEEDED[m]]}" for m in missing]
        ok, out = pip(["--retries", "1", "--timeout", "15", *specs], 300)
        info["registry_install"] = {"specs": specs, "result": "ok" if ok else f"failed: {out}"}
    info["missing_after"] = missing_modules()
    if not a.no_vllm_install and not os.environ.get("FORGE_VLLM_PYTHON") and importlib.util.find_spec("vllm") is None:
        check.vllm_install = start_vllm_install(check.work / "vllm-install.log")
        info["vllm_venv"] = f"installing in the background into {VLLM_VENV} (docker/requirements-serve-gpu.lock)"
    check.report["setup"] = {"seconds": round(time.monotonic() - start, 1), **info}
    check.write()


def start_vllm_install(log_path: Path) -> subprocess.Popen:
    lock = ROOT / "docker" / "requirements-serve-gpu.lock"
    pip_install = f'"{VLLM_VENV}/bin/python" -m pip install --quiet --disable-pip-version-check --retries 1'
    script = (f'set -e; test -x "{VLLM_VENV}/bin/python" || "{sys.executable}" -m venv "{VLLM_VENV}"; '
              f'{pip_install} --require-hashes -r "{lock}"')  # fmt: skip
    log = open(log_path, "w")  # noqa: SIM115 - the child holds it; closed when this process exits
    return subprocess.Popen(["bash", "-c", script], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def vllm_python(check: Check) -> tuple[str | None, str]:
    """The python that serves vLLM, or None and why not."""
    if os.environ.get("FORGE_VLLM_PYTHON"):
        return os.environ["FORGE_VLLM_PYTHON"], "FORGE_VLLM_PYTHON"
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable, "this python"
    if check.vllm_install is None:
        return None, "vllm not installed (set FORGE_VLLM_PYTHON to a python that imports it)"
    try:
        code = check.vllm_install.wait(timeout=max(check.left() - TIMEOUTS["vllm"], 1))
    except subprocess.TimeoutExpired:
        _stop_group(check.vllm_install)
        return None, "the vLLM venv's install did not finish within the budget"
    if code != 0:
        return None, f"the vLLM venv's install failed: {_last_error(check.work / 'vllm-install.log')}"
    return str(VLLM_VENV / "bin" / "python"), str(VLLM_VENV)


# ----------------------------------------------------------------------------------------------------------------
# main


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    check = Check(args)
    check.log.parent.mkdir(parents=True, exist_ok=True)
    check.log.write_text("")
    if not args.dry_run:
        setup(check)
    env = check.part("environment")
    cuda = bool(env.get("cuda_available"))
    no_cuda = None if cuda else "no CUDA"
    if not args.dry_run and not cuda:
        print("[gpu_check] no CUDA device: the parts run on CPU (slowly); use --dry-run for the CPU rehearsal")
    check.part("train_bf16")
    check.part("train_compile")
    eager = check.report["parts"]["train_bf16"]["figures"].get("tokens_per_s")
    compiled = check.report["parts"]["train_compile"]["figures"]
    if eager and compiled.get("tokens_per_s"):
        compiled["speedup_over_eager"] = round(compiled["tokens_per_s"] / eager, 3)
        check.write()
    demo = check.part("demo_model")
    demo_skip = None if demo.get("dir") else "no demo model (demo_model did not succeed)"
    check.part("bnb", {"demo_dir": demo.get("dir")}, skip=demo_skip)
    python, why = vllm_python(check) if cuda else (None, "")
    vllm_skip = no_cuda or demo_skip or (None if python else why)
    check.part("vllm", {"demo_dir": demo.get("dir"), "vllm_python": python}, skip=vllm_skip)
    if python:
        check.report["parts"]["vllm"]["figures"]["vllm_python"] = why
    check.write()
    shutil.rmtree(check.work, ignore_errors=True)
    return check.report


def summary(report: dict[str, Any]) -> str:
    """The JSON as RESULTS.md shows it: the machine, then each part's status, seconds and figures."""
    env = report["environment"]
    lines = [f"{env.get('gpu', 'no GPU')} (driver {env.get('driver')}, CUDA {env.get('cuda')}, torch "
             f"{env.get('torch')}), started {report['started']}, {report['seconds']}s in all"
             + (" (DRY RUN on CPU)" if report["dry_run"] else "")]  # fmt: skip
    for name, part in report["parts"].items():
        figures = {k: v for k, v in part["figures"].items() if k != "dir"}
        lines.append(f"{name:<14} {part['status']} ({part['seconds']}s)")
        lines += [f"    {k}: {json.dumps(v)}" for k, v in figures.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "build")) / "gpu_check.json")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, a few steps, no installs")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for every part together")
    parser.add_argument("--wheels", help="install the .whl files of this folder first (offline)")
    parser.add_argument("--no-registry", action="store_true", help="install nothing from the package registry")
    parser.add_argument("--no-vllm-install", action="store_true", help="do not build the vLLM venv")
    parser.add_argument("--demo-train-seconds", type=float, default=None)
    parser.add_argument("--vllm-concurrency", type=int, default=32)
    parser.add_argument("--vllm-max-tokens", type=int, default=64)
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # the child process
    parser.add_argument("--settings", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--record", type=Path, help="write this result JSON's summary into RESULTS.md and stop")
    args = parser.parse_args()
    if args.record:
        from results import recorded  # bench/results.py

        report = json.loads(args.record.read_text())
        if report.get("dry_run"):
            raise SystemExit(f"{args.record} is a dry run on CPU: RESULTS.md keeps a GPU run's figures only")
        with recorded(__file__):
            print(summary(report))
        return
    if args.part:
        run_part(args.part, args.settings, args.result)
        return
    if args.dry_run:
        args.no_registry = args.no_vllm_install = True
        args.wheels = None
    report = run_check(args)
    failed = [n for n, p in report["parts"].items() if not (p["status"] == "ok" or p["status"].startswith("skip"))]
    print(f"[gpu_check] {report['seconds']}s; results in {args.out}; not ok: {', '.join(failed) or 'none'}")


if __name__ == "__main__":
    main()
