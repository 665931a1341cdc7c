"""`forge eval --benchmarks TASKS`: lm-evaluation-harness on the HF model directory, scores folded into eval.json.

The shipped domain task, `forge_qa_mc` (evaluation/lm_eval_task/forge_qa_mc.yaml), is multiple choice over the
held-out Q&A in lm-eval's own YAML task format, reading a local JSONL: the eval stage writes the items it scored
itself (mc_items.jsonl) and a copy of the YAML whose `data_files` points at them into <stage>/lm_eval/. Any other
task name goes to lm-eval's registry (arc_easy, hellaswag...): those run where their datasets are cached, since
nothing is downloaded (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE are set).
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

import yaml

from forge import ForgeError
from forge.config import EvalConfig
from forge.io import atomic_write_json, atomic_write_jsonl, atomic_write_text

log = logging.getLogger("forge.eval")

TASK_DIR = Path(__file__).resolve().parent / "lm_eval_task"
DOMAIN_TASK = "forge_qa_mc"


def prepare_task_dir(out_dir: Path, mc_items: list[dict[str, Any]]) -> Path:
    """Write the domain task's JSONL and its YAML (data_files made absolute) into out_dir; return out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = out_dir / f"{DOMAIN_TASK}.jsonl"
    rows = [{"question": i["question"], "choices": i["choices"], "gold": i["gold"]} for i in mc_items]
    atomic_write_jsonl(data, rows)
    spec = yaml.safe_load((TASK_DIR / f"{DOMAIN_TASK}.yaml").read_text(encoding="utf-8"))
    spec["dataset_kwargs"]["data_files"] = {"test": str(data.resolve())}
    atomic_write_text(out_dir / f"{DOMAIN_TASK}.yaml", yaml.safe_dump(spec, sort_keys=False))
    return out_dir


def _offline() -> None:
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(name, "1")


def run_benchmarks(
    model_dir: Path, tasks: list[str], mc_items: list[dict[str, Any]], out_dir: Path, ecfg: EvalConfig, seed: int
) -> list[dict[str, Any]]:
    """Run lm-eval's `simple_evaluate` on the model directory; one row per (task, metric)."""
    _offline()
    if DOMAIN_TASK in tasks and not mc_items:
        raise ForgeError(f"--benchmarks {DOMAIN_TASK}: no multiple-choice items (too few held-out Q&A pairs)")
    prepare_task_dir(out_dir, mc_items)
    try:
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager
    except ImportError as exc:
        raise ForgeError(
            "--benchmarks (eval.benchmarks) needs lm-evaluation-harness, an optional part of Forge: pip install "
            f"'forge-slm[benchmarks]' (in a checkout: pip install -e '.[benchmarks]'), or leave it empty ({exc})"
        ) from None
    # lm-eval's own registry (thousands of YAML files) is indexed only when a task of it is asked for
    manager = TaskManager(include_path=str(out_dir), include_defaults=any(t != DOMAIN_TASK for t in tasks))
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ForgeError(f"--benchmarks: unknown lm-eval task(s) {', '.join(unknown)} (e.g. {DOMAIN_TASK}, arc_easy)")
    try:
        results = simple_evaluate(
            model="hf",
            model_args={"pretrained": str(Path(model_dir).resolve()), "dtype": "float32", "trust_remote_code": False},
            tasks=tasks, task_manager=manager, batch_size=8, device="cpu", limit=ecfg.benchmark_limit,
            log_samples=False, random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
            fewshot_random_seed=seed, bootstrap_iters=0,
        )  # fmt: skip
    except ForgeError:
        raise
    except Exception as exc:  # noqa: BLE001 - a dataset not cached offline, a task lm-eval cannot build...
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ForgeError(f"--benchmarks {','.join(tasks)}: lm-eval failed: {type(exc).__name__}: {first}") from None
    if results is None:
        raise ForgeError("--benchmarks: lm-eval returned no results")
    atomic_write_json(out_dir / "results.json", {"results": results["results"], "versions": results.get("versions")})
    return fold(results["results"])


def fold(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """lm-eval's {"task": {"acc,none": x, "acc_stderr,none": s, ...}} -> [{"task", "metric", "value", "stderr"}]."""
    rows = []
    for task, scores in sorted(results.items()):
        for key, value in scores.items():
            metric, _, flt = key.partition(",")
            if "_stderr" in metric or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            stderr = scores.get(f"{metric}_stderr,{flt}")
            rows.append({
                "task": task, "metric": metric, "value": float(value),
                "stderr": float(stderr) if isinstance(stderr, (int, float)) and math.isfinite(stderr) else None,
            })  # fmt: skip
    return rows
