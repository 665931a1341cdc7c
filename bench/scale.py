"""Benchmark: how each stage's time and memory grow with the corpus, and what that predicts at 500M and 10B tokens.

    .venv/bin/python bench/scale.py                                     # 20k, 80k, 320k documents: ~1-2 h, 2 cores
    .venv/bin/python bench/scale.py --sizes 2000,4000,8000 --no-record  # a rehearsal: ~9 min on 2 busy cores
    .venv/bin/python bench/scale.py --sizes 2000,8000 --near-dup-share 0.1 --set eval.qa_max_examples=50

For each size, a corpus of real-looking documents (bench/scale_corpus.py: Markov text from the stdlib's own prose,
headings and sections, every paragraph unique, --near-dup-share near-duplicates and --exact-dup-share exact
copies) is written as JSONL, and the real CLI runs on it in a fresh runs directory, one process per stage:
`forge data`, `forge qa`, `forge tokenizer`, `forge pretrain` (--steps steps of a tiny model) and `forge eval
--target pretrain`, with the default settings otherwise (what a user's corpus gets). Per stage:

  time  wall seconds of the stage's process, start-up (imports, MLflow) included;
  RSS   the peak over polls every 0.1 s of the RSS summed over the process and all its children (the data stage's
        worker pool), never below the largest single process's own peak (ru_maxrss). Pages shared between the
        processes count once per process, so this is an upper bound of what the tree held.

The growth is the least-squares slope of log(value) against log(documents): the exponent, and 2^exponent, the factor
per doubling of the corpus. Extrapolations start from the largest size measured and follow that slope to the
documents that hold 500M and 10B tokens at the tokens per document measured (the tokenizer stage's tokens of the
three splits over the input documents). pretrain and eval do fixed work (a few steps, a fixed number of eval items),
so theirs is the cost of starting and loading, not of a full run: `forge plan` estimates training time.

On a shared machine the times are noisy: the load average is printed, and a small run's exponents are rough.
The results go to --out (JSON), a plot beside it (matplotlib), and the table to RESULTS.md (bench/results.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
from scale_corpus import generate, stdlib_chain  # noqa: E402

STAGES = {  # verb -> its own arguments
    "data": [],
    "qa": [],
    "tokenizer": [],
    "pretrain": [],
    "eval": ["--target", "pretrain"],
}
STAGE_DIRS = {"eval": "eval-pretrain"}  # runs/<run>/<dir>/ of a stage, where not its verb
# The tiny model of tests/test_pretrain.py (context 128 instead of 64) and a small vocabulary: the stages that
# scale with the corpus are data, qa and tokenizer; these keep pretrain and eval to their fixed costs.
MODEL = [
    "tokenizer.vocab_size=4096", "model.architecture=llama", "model.hidden_size=64", "model.num_layers=2",
    "model.num_attention_heads=2", "model.intermediate_size=192", "model.context_length=128",
    "train.micro_batch_size=8", "train.grad_accum_steps=1", "train.lr=3e-3", "train.warmup_steps=2",
    "train.eval_batches=4", "train.precision=fp32",
]  # fmt: skip
TARGETS = {"500M tokens": 500e6, "10B tokens": 10e9}
FIXED_DOMINATES = 0.5  # fixed part of the largest size's value above which its extrapolations are marked with *
POLL_S = 0.1


# ----------------------------------------------------------------------------------------------------------------
# growth: pure functions of the measurements


@dataclass(frozen=True)
class Growth:
    exponent: float  # value ~ documents ** exponent (least squares on log-log)

    @property
    def per_doubling(self) -> float:
        return 2.0**self.exponent


def fit_growth(sizes: Sequence[float], values: Sequence[float]) -> Growth:
    """The least-squares slope of log(value) on log(size); needs two distinct sizes and positive values."""
    if len(sizes) != len(values) or len(set(sizes)) < 2:
        raise ValueError(f"fit_growth needs values at two or more distinct sizes, got sizes={list(sizes)}")
    if min(values) <= 0 or min(sizes) <= 0:
        raise ValueError(f"fit_growth needs positive sizes and values, got {list(sizes)} -> {list(values)}")
    xs, ys = [math.log(s) for s in sizes], [math.log(v) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return Growth(slope)


def extrapolate(sizes: Sequence[float], values: Sequence[float], growth: Growth, target: float) -> float | None:
    """The value at `target` documents, from the largest size measured along the fitted slope; None where the
    value fell as the corpus grew (noise or fixed costs dominate the sizes measured: nothing to extrapolate)."""
    if growth.exponent < 0:
        return None
    largest = max(range(len(sizes)), key=lambda i: sizes[i])
    return values[largest] * (target / sizes[largest]) ** growth.exponent


@dataclass(frozen=True)
class Linear:
    fixed: float  # the intercept: what the stage costs whatever the corpus (start-up, models, reports)
    per_doc: float  # the marginal cost of one more document at the sizes measured

    def at(self, documents: float) -> float | None:
        """The value at `documents`; None where it fell as the corpus grew (nothing to extrapolate)."""
        return None if self.per_doc < 0 else self.fixed + self.per_doc * documents


def fit_linear(sizes: Sequence[float], values: Sequence[float]) -> Linear:
    """The least-squares line value = fixed + per_doc * size. Where its fixed part is most of the largest value,
    the log-log slope says more about fixed costs than about growth: larger corpora will grow faster than it says
    (the table marks those extrapolations, FIXED_DOMINATES)."""
    if len(sizes) != len(values) or len(set(sizes)) < 2:
        raise ValueError(f"fit_linear needs values at two or more distinct sizes, got sizes={list(sizes)}")
    mx, my = sum(sizes) / len(sizes), sum(values) / len(values)
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes, values, strict=True)) / sum((x - mx) ** 2 for x in sizes)
    return Linear(my - slope * mx, slope)


def documents_for(tokens: float, tokens_per_doc: float) -> float:
    return tokens / tokens_per_doc


# ----------------------------------------------------------------------------------------------------------------
# measuring one stage process


@dataclass
class Measured:
    seconds: float
    peak_rss: int  # bytes, the largest sum over the process tree at one poll (at least max_rss)
    max_rss: int  # bytes, the largest single process of the tree (ru_maxrss of it and its reaped children)
    cpu_seconds: float  # user + system of the process and its reaped children: less noisy than wall time
    load_average: float  # the machine's 1-minute load average when the stage ended


def tree_rss(pid: int) -> int:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):  # a worker that just exited
            total += proc.memory_info().rss
    return total


def measure(name: str, cmd: list[str], env: dict[str, str], log_path: Path) -> Measured:
    """Run `cmd` to the end, polling its tree's RSS; raise with the log's tail if it fails."""
    with open(log_path, "ab") as log:
        log.write(f"\n$ {' '.join(cmd)}\n".encode())
        log.flush()
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        peak = 0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(POLL_S)
        seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
        raise RuntimeError(f"{name} exited with {proc.returncode} (log: {log_path}):\n{tail}")
    max_rss = usage.ru_maxrss * 1024
    cpu = usage.ru_utime + usage.ru_stime
    return Measured(seconds, max(peak, max_rss), max_rss, cpu, os.getloadavg()[0])


# ----------------------------------------------------------------------------------------------------------------
# one corpus size


def write_corpus(path: Path, n: int, args: argparse.Namespace) -> dict:
    """The JSONL corpus of n documents (temp file, then renamed); what it holds."""
    start, kinds = time.perf_counter(), {"unique": 0, "near_dup": 0, "exact_dup": 0}
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for doc in generate(stdlib_chain(), n, args.seed, args.near_dup_share, args.exact_dup_share):
            title = doc.text.split("\n", 1)[0].removeprefix("# ")
            fh.write(json.dumps({"id": doc.id, "title": title, "text": doc.text}) + "\n")
            kinds[doc.kind] += 1
    os.replace(tmp, path)
    return {"documents": n, **kinds, "bytes": path.stat().st_size, "seconds": time.perf_counter() - start}


def manifest(runs: Path, run: str, stage_dir: str) -> dict:
    """A stage's manifest.json: its headline metrics, and its own duration (the process's, less start-up)."""
    return json.loads((runs / run / stage_dir / "manifest.json").read_text())


def data_summary(runs: Path, run: str) -> dict:
    """What the data stage kept and, per filter, the documents it removed (from its report.json)."""
    report = json.loads((runs / run / "data" / "report.json").read_text())
    removed = {name: f["docs"] for name, f in report["filters"].items() if f["docs"]}
    return {"kept": report["kept"]["docs"], "removed": removed}


def warm_up() -> None:
    """Import what the stages import once, untimed: the first size's stages would otherwise also pay for reading
    torch's and transformers' libraries from disk."""
    code = "import torch, transformers, mlflow, tokenizers, pyarrow, forge.cli"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def run_size(n: int, work: Path, args: argparse.Namespace) -> dict:
    """Write the corpus of n documents, run every stage on it in a fresh runs directory; the figures."""
    size_dir = work / f"docs-{n}"
    shutil.rmtree(size_dir, ignore_errors=True)
    (size_dir / "corpus").mkdir(parents=True)
    runs, run = size_dir / "runs", f"scale-{n}"
    print(f"\n{n:,} documents: writing the corpus ...", flush=True)
    corpus = write_corpus(size_dir / "corpus" / "corpus.jsonl", n, args)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {"FORGE_RUNS_DIR": str(runs)}
    sets = [f"data.inputs=[{size_dir / 'corpus'}]", *MODEL, f"train.max_steps={args.steps}",
            f"train.eval_every={args.steps}", f"train.checkpoint_every={args.steps}", *args.set]  # fmt: skip
    common = ["--run", run, *(arg for item in sets for arg in ("--set", item))]
    stages = {}
    for stage, own in STAGES.items():
        cmd = [sys.executable, "-m", "forge.cli", stage, *own, *common]
        stages[stage] = measure(f"forge {stage}", cmd, env, size_dir / "stages.log")
        m = stages[stage]
        print(f"  {stage:<10}{m.seconds:>9.1f} s{m.peak_rss / 2**20:>9.0f} MB  ({m.cpu_seconds:.0f} CPU-s)", flush=True)
    tok = manifest(runs, run, "tokenizer")["metrics"]
    tokens = sum(tok[f"tokens_{s}"] for s in ("train", "val", "test"))
    qa = manifest(runs, run, "qa")["metrics"]
    corpus |= data_summary(runs, run) | {"tokens": tokens, "tokens_per_doc": tokens / n}
    corpus |= {"qa_pairs": {"train": qa.get("train_pairs"), "eval": qa.get("eval_pairs")}}
    figures = {s: asdict(m) | {"stage_seconds": manifest(runs, run, STAGE_DIRS.get(s, s))["duration_s"]}
               for s, m in stages.items()}  # fmt: skip
    if not args.keep:
        shutil.rmtree(size_dir)
    return {"corpus": corpus, "stages": figures}


def check_kept(n: int, corpus: dict) -> str:
    """A line on how much the data stage kept of the unique documents (the copies are meant to go)."""
    share = corpus["kept"] / max(corpus["unique"], 1)
    removed = ", ".join(f"{name} {docs:,}" for name, docs in corpus["removed"].items()) or "nothing"
    line = f"{n:>9,} docs: kept {corpus['kept']:,} ({share:.0%} of the {corpus['unique']:,} unique); removed: {removed}"
    if share < 0.8:
        line += "\n  WARNING: the filters dropped many unique documents: rerun with --keep and read data/report.md"
    return line


# ----------------------------------------------------------------------------------------------------------------
# the table, the JSON and the plot


def human_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= 2 * size:
            return f"{s / size:.1f} {unit}"
    return f"{s:.1f} s"


def human_bytes(b: float | None) -> str:
    if b is None:
        return "-"
    for unit, size in (("TB", 2**40), ("GB", 2**30)):
        if b >= size:
            return f"{b / size:.1f} {unit}"
    return f"{b / 2**20:.0f} MB"


# the table's rows per stage: the measure, its label, its unit
ROWS = (("seconds", "time", human_seconds), ("cpu_seconds", "CPU", human_seconds), ("peak_rss", "RSS", human_bytes))


def analyse(sizes: list[int], results: dict[int, dict]) -> dict:
    """Per stage and metric: the values at each size, the fit, and the extrapolations to TARGETS."""
    per_doc = results[max(sizes)]["corpus"]["tokens_per_doc"]
    targets = {name: documents_for(tokens, per_doc) for name, tokens in TARGETS.items()}
    series = {s: {metric: [results[n]["stages"][s][metric] for n in sizes] for metric, _, _ in ROWS} for s in STAGES}
    series["total"] = {metric: [(max if metric == "peak_rss" else sum)(series[s][metric][i] for s in STAGES)
                                for i in range(len(sizes))] for metric, _, _ in ROWS}  # fmt: skip
    out: dict = {"tokens_per_doc": per_doc, "target_documents": targets, "stages": {}}
    for stage, metrics in series.items():
        out["stages"][stage] = {}
        for metric, values in metrics.items():
            growth, line = fit_growth(sizes, values), fit_linear(sizes, values)
            out["stages"][stage][metric] = {
                "values": values, "exponent": growth.exponent, "per_doubling": growth.per_doubling,
                "fixed": line.fixed, "per_doc": line.per_doc, "fixed_share": line.fixed / values[-1],
                "extrapolated": {name: extrapolate(sizes, values, growth, docs) for name, docs in targets.items()},
                "linear": {name: line.at(docs) for name, docs in targets.items()},
            }  # fmt: skip
    return out


def table(sizes: list[int], analysis: dict) -> str:
    head = f"{'stage':<16}" + "".join(f"{n:>10,}" for n in sizes) + f"{'per 2x':>9}{'exp':>7}{'per 1k docs':>12}"
    lines = [f"{'':<16}{'documents':>{10 * len(sizes)}}", head + "".join(f"{name:>13}" for name in TARGETS)]
    for stage, metrics in analysis["stages"].items():
        for metric, label, fmt in ROWS:
            m = metrics[metric]
            measured = "".join(f"{fmt(v):>10}" for v in m["values"])
            growth = f"{m['per_doubling']:>8.2f}x{m['exponent']:>7.2f}{fmt(m['per_doc'] * 1000):>12}"
            mark = "*" if m["fixed_share"] > FIXED_DOMINATES and m["extrapolated"][next(iter(TARGETS))] else " "
            ahead = "".join(f"{fmt(m['extrapolated'][name]) + mark:>13}" for name in TARGETS)
            lines.append(f"{stage if metric == 'seconds' else '':<10}{label:<6}{measured}{growth}{ahead}".rstrip())
    docs = ", ".join(f"{name}: {d:,.0f} documents" for name, d in analysis["target_documents"].items())
    lines += [
        "time: wall; CPU: user + system of the stage's processes; RSS: the peak of their sum. total: the stages' "
        "times summed, the largest stage's RSS. per 1k docs: the slope of the least-squares line (the marginal cost).",
        f"Extrapolated along the log-log slope from the largest size, at {analysis['tokens_per_doc']:.0f} tokens per "
        f"document ({docs}).",
        f"*: the line's fixed part is over {FIXED_DOMINATES:.0%} of the largest value: start-up and fixed work "
        "dominate these sizes, so a larger corpus grows faster than the slope says (measure larger sizes); right "
        "for pretrain and eval, which do fixed work. -: the value fell as the corpus grew (noise).",
    ]  # fmt: skip
    return "\n".join(lines)


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def plot(path: Path, sizes: list[int], analysis: dict) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install matplotlib)"
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = (("seconds", "wall seconds", 1.0), ("peak_rss", "peak RSS of the stage's processes (MB)", 2**-20))
    for ax, (metric, unit, scale) in zip(axes, panels, strict=True):
        for stage in STAGES:
            ax.plot(sizes, [v * scale for v in analysis["stages"][stage][metric]["values"]], "o-", label=stage)
        ax.set(xscale="log", yscale="log", xlabel="documents", ylabel=unit)
        ax.set_xticks(sizes, [f"{n:,}" for n in sizes])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.suptitle("forge stages against corpus size (log-log)")
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return f"plot: {path}"


# ----------------------------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="20000,80000,320000", help="documents per corpus, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--near-dup-share", type=float, default=0.05, help="documents that are near-copies")
    parser.add_argument("--exact-dup-share", type=float, default=0.02, help="documents that are exact copies")
    parser.add_argument("--steps", type=int, default=20, help="pretrain steps")
    parser.add_argument("--set", action="append", default=[], help="a config override for every stage (repeatable)")
    parser.add_argument("--work-dir", type=Path, help="where corpora and runs go (default: a new dir under /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep each size's corpus and runs directory")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "scale" / "scale.json", help="results JSON")
    args = parser.parse_args()
    try:
        args.sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: expected document counts such as 2000,8000")
    if len(args.sizes) < 2 or min(args.sizes) < 200:
        parser.error(f"--sizes {args.sizes}: give two or more sizes of at least 200 documents (val and test need some)")
    return args


def main() -> None:
    args = parse_args()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="forge-scale-", dir="/tmp"))  # each size's dir is
    print(f"sizes {args.sizes}, seed {args.seed}, near-dup share {args.near_dup_share}, exact-dup share "
          f"{args.exact_dup_share}, {args.steps} pretrain steps; work dir {work}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)  # fmt: skip
    print("building the Markov chain from the stdlib's prose; warming the file cache ...", flush=True)
    stdlib_chain()
    warm_up()
    results = {n: run_size(n, work, args) for n in args.sizes}  # deleted after it, unless --keep or it failed
    if not args.keep and not args.work_dir:
        work.rmdir()
    analysis = analyse(args.sizes, results)
    print("\nwhat the data stage kept (near and exact copies are meant to go):")
    print("\n".join(check_kept(n, results[n]["corpus"]) for n in args.sizes))
    print(f"\n{table(args.sizes, analysis)}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (a busy machine: noisy times)")
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    payload = {"command": sys.argv, "settings": settings, "runs": {str(n): r for n, r in results.items()}, **analysis}
    write_json(args.out, payload)
    print(f"results: {args.out}\n{plot(args.out.with_suffix('.png'), args.sizes, analysis)}")


if __name__ == "__main__":
    from results import recorded  # bench/results.py: the output goes to RESULTS.md too

    with recorded(__file__):
        main()
