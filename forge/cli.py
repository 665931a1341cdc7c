"""`forge`: one verb per stage, each a thin wrapper over the stage's `run` function (the table in forge/stages.py).

    forge plan --config configs/tiny-cpu.yaml
    forge data --config configs/tiny-cpu.yaml --set data.dedup.jaccard_threshold=0.85
    forge pipeline --config configs/tiny-cpu.yaml
    forge status tiny-cpu

Errors a user can fix (bad config, bad input) print one line and exit 2; `--force` re-runs an up-to-date stage.
Each verb's --help names the file its code starts in.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperGroup

from forge import ForgeError
from forge.config import ForgeConfig, load_config
from forge.lineage import stage_states
from forge.paths import runs_root
from forge.stages import RUN_LAYOUT, STAGES


class StageOrder(TyperGroup):
    """Lists the verbs in pipeline order in --help, whatever order they were defined in."""

    def list_commands(self, ctx):
        order = [*STAGES, "pipeline", "status", "registry"]
        return sorted(super().list_commands(ctx), key=lambda n: order.index(n) if n in order else len(order))


app = typer.Typer(
    cls=StageOrder,
    help="Forge: train, evaluate, quantize, gate and serve small domain language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="Run config YAML (see configs/).")]
SetOpt = Annotated[
    Optional[list[str]], typer.Option("--set", help="Override a config field: --set train.lr=1e-3 (repeatable).")
]
RunOpt = Annotated[Optional[str], typer.Option("--run", help="Run name (default: the config's run_name).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Re-run even if inputs and config are unchanged.")]


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn errors a user can fix into one line on stderr and exit code 2."""
    try:
        yield
    except ForgeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def resolve_config(config: Path | None, overrides: list[str] | None, run: str | None) -> ForgeConfig:
    extra = list(overrides or []) + ([f"run_name={run}"] if run else [])
    return load_config(config, extra)


def run_verb(name: str, config: Path | None, overrides: list[str] | None, run: str | None, force: bool,
             **options: Any) -> dict[str, Any]:  # fmt: skip
    with user_errors():
        cfg = resolve_config(config, overrides, run)
        return STAGES[name].load()(cfg, force=force, **options)


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("mlflow", "alembic", "urllib3", "httpx", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


# ----------------------------------------------------------------------------------------------------------------
# one verb per stage


def _stage_verb(name: str) -> None:
    spec = STAGES[name]

    def verb(config: ConfigOpt = None, set_: SetOpt = None, run: RunOpt = None, force: ForceOpt = False) -> None:
        run_verb(name, config, set_, run, force)

    verb.__doc__ = spec.summary[0].upper() + spec.summary[1:] + "."
    app.command(name)(verb)


# Stages whose verb takes options of its own define it below, by name, instead of the generic one.
DEDICATED_VERBS: set[str] = {"plan", "eval"}


@app.command("plan")
def plan_verb(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run: RunOpt = None,
    force: ForceOpt = False,
    hardware: Annotated[Optional[str], typer.Option(
        "--hardware", help="A profile of pretrain/hardware.py (rtx4090, a100-80gb, h100-80gb, h200, ...), cpu, or "
        "custom (with plan.memory_gb and plan.peak_tflops); default: the config's plan.hardware.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:  # fmt: skip
    """Parameters, token budget, memory per GPU, OOM verdict, time and disk: before anything runs."""
    manifest = run_verb("plan", config, set_, run, force, hardware=hardware)
    evidence = run_verb("evidence", config, set_, run, force)  # an error naming the setting when the gate's
    if as_json:  # evidence cannot be collected
        typer.echo(json.dumps({**manifest["plan"], "evidence": evidence}, indent=2))
    else:
        typer.echo(manifest["plan_text"].rstrip("\n") + "\n\n" + STAGES["evidence"].call("render")(evidence))


DEDICATED_VERBS |= {"data"}


@app.command("data")
def data_verb(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run: RunOpt = None,
    force: ForceOpt = False,
    executor: Annotated[Optional[str], typer.Option(
        "--executor", help="local (this machine's process pool) or ray (Ray Data); default: data.executor.")] = None,
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray-address", help="Ray cluster address (HOST:6379 or ray://HOST:10001); default: data.ray_address, "
        "else a local Ray instance.")] = None,
) -> None:  # fmt: skip
    """Ingest, split 98:1:1, clean, deduplicate, report what was removed."""
    extra = [f"data.executor={executor}"] if executor else []
    extra += [f"data.ray_address={ray_address}"] if ray_address else []
    run_verb("data", config, [*(set_ or []), *extra], run, force)


@app.command("eval")
def eval_verb(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run: RunOpt = None,
    force: ForceOpt = False,
    target: Annotated[str, typer.Option(
        "--target", help="pretrain, sft, or a PATH: a model directory or a .gguf file.")] = "sft",
    benchmarks: Annotated[Optional[str], typer.Option(
        "--benchmarks", help="lm-eval tasks, comma-separated: forge_qa_mc,arc_easy (default: eval.benchmarks)")] = None,
) -> None:  # fmt: skip
    """Bits per byte, domain tasks and red flags for a model; writes eval.json and report.md."""
    names = [t.strip() for t in benchmarks.split(",") if t.strip()] if benchmarks is not None else None
    manifest = run_verb("eval", config, set_, run, force, target=target, benchmarks=names)
    failed = int(manifest.get("metrics", {}).get("flags_failed", 0))
    typer.echo(f"{manifest['stage']}: {'FAIL' if failed else 'PASS'} ({failed} red flag(s) failed); "
               f"see runs/{manifest['run']}/{manifest['stage']}/report.md")  # fmt: skip


# ---- the registry gate: register, promote, rollback, registry history
DEDICATED_VERBS |= {"register", "promote", "rollback"}
NameArg = Annotated[Optional[str], typer.Argument(help="Registered model name (default: registry.model_name).")]
registry_app = typer.Typer(help="The MLflow model registry: history of @production.", no_args_is_help=True)
app.add_typer(registry_app, name="registry")


@app.command("register")
def register_verb(config: ConfigOpt = None, set_: SetOpt = None, run: RunOpt = None, force: ForceOpt = False) -> None:
    """Register the run's model as a new version, with its GGUFs, tokenizer, eval and quantization reports."""
    manifest = run_verb("register", config, set_, run, force)
    typer.echo(f"registered {manifest['run']}: version {int(manifest['metrics']['version'])}")


@app.command("promote")
def promote_verb(
    name: NameArg = None,
    version: Annotated[Optional[str], typer.Argument(help="Version to promote (default: the newest).")] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run: RunOpt = None,
) -> None:
    """Judge a version by the gate policy; move @production only if every check passes (exit 1 if refused)."""
    with user_errors():
        decision = STAGES["promote"].call("decide")(resolve_config(config, set_, run), name, version)
    typer.echo(decision.table())
    if not decision.passed:
        raise typer.Exit(1)
    typer.echo(f"{decision.name}@production -> v{decision.version}")


@app.command("rollback")
def rollback_verb(name: NameArg = None, config: ConfigOpt = None, set_: SetOpt = None, run: RunOpt = None) -> None:
    """Move @production back to the previous version that passed the gate."""
    with user_errors():
        moved = STAGES["rollback"].load()(resolve_config(config, set_, run), name)
    typer.echo(f"{moved['name']}@production: v{moved['previous']} -> v{moved['version']}")


@registry_app.command("history")
def registry_history_verb(name: NameArg = None, config: ConfigOpt = None, set_: SetOpt = None, run: RunOpt = None,
                          as_json: Annotated[bool, typer.Option("--json", help="Print the events as JSON.")] = False,
                          ) -> None:  # fmt: skip
    """Every promotion, refusal and rollback: which version was in production when."""
    with user_errors():
        log_events = STAGES["promote"].call("events")(resolve_config(config, set_, run), name)
    typer.echo(json.dumps(log_events, indent=2) if as_json else STAGES["promote"].call("format_history")(log_events))


# ---- end of the registry gate


# ---- serving: serve, chat, bundle
DEDICATED_VERBS |= {"serve", "chat", "bundle"}


@app.command("serve")
def serve_verb(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run: RunOpt = None,
    bundle: Annotated[Optional[Path], typer.Option(
        "--bundle", help="Serve a deploy bundle directory (every sha256 is checked first).")] = None,
    backend: Annotated[Optional[str], typer.Option(
        "--backend", help="auto (vLLM with CUDA, else llama.cpp's llama-server), llamacpp, llama-cpp-python or vllm "
        "(default: serve.backend).")] = None,
    gguf: Annotated[Optional[Path], typer.Option(
        "--gguf", help="Serve this GGUF file directly instead of @production (bypasses the gate).")] = None,
    port: Annotated[Optional[int], typer.Option("--port", help="Port (default: serve.port).")] = None,
) -> None:  # fmt: skip
    """Serve the production model (llama.cpp on CPU, vLLM on GPU) with an OpenAI API on 127.0.0.1."""
    run_verb("serve", config, set_, run, False, bundle=bundle, backend=backend, gguf=gguf, port=port)


@app.command("chat")
def chat_verb(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run: RunOpt = None,
    api_base: Annotated[Optional[str], typer.Option(
        "--api-base", help="OpenAI API of the server (default: http://serve.host:serve.port/v1).")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="Served model name (default: asked).")] = None,
) -> None:  # fmt: skip
    """The Gradio chat UI on 127.0.0.1:serve.ui_port in front of a served model."""
    run_verb("chat", config, set_, run, False, api_base=api_base, model=model)


@app.command("bundle")
def bundle_verb(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run: RunOpt = None,
    out: Annotated[Optional[Path], typer.Option(
        "--out", help="Bundle directory; a .tar.gz is written beside it (default: runs/<run>/bundle).")] = None,
) -> None:  # fmt: skip
    """A checksummed CPU deploy bundle (GGUF, manifest, run.sh, Dockerfile) of the production model."""
    manifest = run_verb("bundle", config, set_, run, False, out=out)
    typer.echo(f"bundle {manifest['dir']} (v{manifest['source']['version']}), tarball {manifest.get('tarball')}")


# ---- end of serving
for _name in STAGES:
    if _name not in DEDICATED_VERBS:
        _stage_verb(_name)
for _command in app.registered_commands:  # every stage verb's --help ends with the file its code starts in
    if _command.name in STAGES:
        where = f"(code: {STAGES[_command.name].code})"
        _command.help = _command.short_help = f"{inspect.getdoc(_command.callback)} {where}"


# ----------------------------------------------------------------------------------------------------------------
# pipeline and status


@app.command()
def pipeline(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run: RunOpt = None,
    force: ForceOpt = False,
    no_serve: Annotated[bool, typer.Option(
        "--no-serve", help="Stop after the gate and the report card (default: serve the promoted model and open the "
        "chat UI).")] = False,
) -> None:  # fmt: skip
    """Run every stage in order (unchanged ones are skipped), write the report card, then serve and chat."""
    from forge import pipeline as lifecycle

    with user_errors():
        cfg = resolve_config(config, set_, run)
        try:
            lifecycle.run(cfg, force=force, serve=not no_serve, echo=typer.echo)
        except lifecycle.PipelineStopped as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(1) from None


@app.command()
def status(
    run: Annotated[str, typer.Argument(help="Run name (a directory under runs/).")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show each stage of a run: its state, when it finished and its headline metrics."""
    run_path = runs_root() / run
    with user_errors():
        if not run_path.is_dir():
            known = sorted(p.name for p in runs_root().glob("*") if p.is_dir() and not p.name.startswith("."))
            raise ForgeError(f"no run {run!r} under {runs_root()}/ (runs: {', '.join(known) or 'none yet'})")
    extra = sorted(p.name for p in run_path.iterdir() if p.is_dir() and p.name not in RUN_LAYOUT)
    rows = stage_states(run_path, RUN_LAYOUT + extra)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        metrics = ", ".join(f"{k}={_short(v)}" for k, v in list(row["metrics"].items())[:6])
        when = f"  {row['finished_at']}  {row['duration_s']}s" if row.get("finished_at") else ""
        typer.echo(f"{row['stage']:<14} {row['state']:<10}{when}  {metrics}".rstrip())
        if row.get("error"):
            typer.echo(f"{'':<14} error: {row['error']}")


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def main() -> None:
    _setup_logging()
    app()


if __name__ == "__main__":
    main()
