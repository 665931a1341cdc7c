"""`forge sft`: supervised fine-tuning of the pretrained model on domain Q&A with TRL (full, LoRA or QLoRA).

    forge sft --config configs/tiny-cpu.yaml
    forge sft --config configs/tiny-cpu.yaml --set sft.mode=qlora

Reads the base model (`sft.base_model`, default runs/<run>/pretrain/model/: an HF directory with its tokenizer and
chat template) and the run's Q&A set: runs/<run>/qa/qa_train.jsonl, built by `forge qa` (pretrain/qa/; a user's own
pairs are given there, as `qa.source`), read line by line by finetune/sft_data.py. Writes into runs/<run>/sft/:
  model/            the fine-tuned model, LoRA merged in: an HF directory with the base's tokenizer files and chat
                    template copied byte for byte, ready for `forge eval`, `forge quantize` and serving
  adapter/          the LoRA adapter (lora, qlora)
  sft_train.jsonl   the conversations trained on
  data_report.json  lines read, lines skipped with their line numbers and reasons (over-length included), count
                    against the 10k-100k guidance
  train_history.jsonl, samples.json   per-step logs; greedy answers to a few held-out questions

Loss mask: supervised tokens are exactly each assistant reply plus the EOS that ends it, never the role tokens,
the system or the user turns (pinned by tests/test_sft.py and, for a base model's template, tests/test_base_model.py).
  - A template with `{% generation %}` markers: TRL's `assistant_only_loss=True` as it is.
  - Forge's template (pretrain/tokenizer.py) has none and TRL cannot patch it (it knows only public model families):
    training uses a copy with the assistant reply AND its EOS inside the markers, checked to render byte-identical
    to the shipped one; the shipped template is what the exported model carries.
  - Any other template (a base model's own: ChatML, Llama 3...): each conversation is rendered and tokenized here
    and the mask is built from the rendering itself. The reply of assistant turn i is what rendering turns 0..i adds
    to rendering turns 0..i-1 with the generation prompt, up to and including the EOS token (text after the EOS,
    such as ChatML's newline, is not supervised). A template whose earlier turns render differently once later
    turns exist, whose assistant turns do not end with the EOS token, or a token that straddles a reply's edge, is
    refused with a ForgeError rather than trained with an inexact mask.
`completion_only_loss` (prompt/completion) was not used: it supervises only the LAST assistant turn of a multi-turn
conversation.

Modes: full (every weight trains), lora (peft LoRA on every linear layer but the output head), qlora (the base
loaded as bitsandbytes 4-bit NF4 with double quantisation and bf16 compute, then LoRA; runs on CPU too). A LoRA
adapter is merged into the base loaded at its saved precision (for qlora: the unquantized base, as peft documents;
the merged model differs from the trained quantized-base + adapter by the base's NF4 rounding error).
"""

from __future__ import annotations

import logging
import math
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from finetune.sft_data import Example, guidance, read_jsonl
from forge import ForgeError
from forge.config import ForgeConfig, SFTConfig
from forge.io import atomic_path, atomic_write_json, atomic_write_jsonl
from forge.lineage import Stage, require_reads, run_stage
from forge.paths import run_dir
from models import TOKENIZER_FILES
from pretrain.qa import records
from pretrain.qa.stage import QASet, qa_set, refuse_wrong_domain, source_kind

log = logging.getLogger("forge.sft")

SAMPLE_QUESTIONS = 3  # held-out questions answered greedily after training, saved in samples.json
SAMPLE_NEW_TOKENS = 64

# The assistant turn of the Forge chat template: {{ '<|assistant|>' + message['content'] + '[EOS]' }}
_ASSISTANT_TURN = re.compile(r"\{\{-?\s*'(?P<role>[^']+)'\s*\+\s*message\['content'\]\s*\+\s*'(?P<eos>[^']+)'\s*-?\}\}")
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
_PROBES = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What does `len` do?"},
        {"role": "assistant", "content": "Return the number of items."},
        {"role": "user", "content": "And `abs`?"},
        {"role": "assistant", "content": "The absolute value."},
    ],
]


# ----------------------------------------------------------------------------------------------------------------
# inputs


def base_model_dir(cfg: ForgeConfig) -> Path:
    base = Path(cfg.sft.base_model) if cfg.sft.base_model else run_dir(cfg) / "pretrain" / "model"
    if not (base / "config.json").is_file():
        hint = "set sft.base_model to an HF model directory" if cfg.sft.base_model else (
            "run `forge pretrain` with the same --config first, or set sft.base_model"
        )  # fmt: skip
        raise ForgeError(f"no base model at {base} (config.json missing); {hint}")
    return base


def run(cfg: ForgeConfig, force: bool = False) -> dict[str, Any]:
    """Fine-tune the base model on the run's Q&A set; export the merged model and the adapter."""
    refuse_wrong_domain(cfg, source_kind(cfg)[0])  # first: a Q&A set of the wrong domain is refused outright
    require_reads(cfg, "sft", ["qa", *([] if cfg.sft.base_model else ["pretrain"])])
    base = base_model_dir(cfg)
    qa = qa_set(cfg)
    inputs = {"base": base, "data": qa.train, "held_out": qa.held_out}
    stage = Stage(name="sft", cfg=cfg, inputs=inputs)
    return run_stage(stage, lambda s: _sft(s, qa), force=force)


# ----------------------------------------------------------------------------------------------------------------
# tokenizer and the training chat template


def load_tokenizer(base: Path) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    if not tokenizer.chat_template:
        raise ForgeError(f"{base} has no chat template (chat_template.jinja); SFT and serving need one")
    if tokenizer.eos_token is None:
        raise ForgeError(f"{base}: the tokenizer has no EOS token; the chat template must end assistant turns with it")
    return tokenizer


def training_chat_template(tokenizer: Any) -> str | None:
    """The shipped chat template with `{% generation %}` around each assistant reply + its EOS (TRL's
    assistant_only_loss mask), checked to render exactly like the shipped one; None for a template that is not
    Forge's and has no markers (the mask is then built from renderings: `assistant_mask`)."""
    template = tokenizer.chat_template
    if _GENERATION.search(template):
        return template  # already marked: TRL uses it as it is
    found = list(_ASSISTANT_TURN.finditer(template))
    if len(found) != 1:
        return None
    m = found[0]
    if m["eos"] != tokenizer.eos_token:
        # a turn that does not end with EOS: another role's (Mistral's "[INST] ... [/INST]" user turn), not Forge's
        # assistant turn; the renderings then give the mask, and refuse a template whose replies miss the EOS
        return None
    patched = (
        template[: m.start()]
        + f"{{{{ '{m['role']}' }}}}{{% generation %}}{{{{ message['content'] + '{m['eos']}' }}}}{{% endgeneration %}}"
        + template[m.end() :]
    )
    for messages in _PROBES:
        for prompt in (False, True):
            a = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
            b = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt,
                                              chat_template=patched)  # fmt: skip
            if a != b:
                raise ForgeError(f"the training chat template renders {b!r} where the shipped one renders {a!r}")
    return patched


def assistant_mask(tokenizer: Any, messages: list[dict[str, str]]) -> dict[str, list[int]]:
    """input_ids and assistant_masks (1: supervised) of a conversation rendered with the tokenizer's own template,
    the mask taken from the renderings (see the module doc)."""
    render = tokenizer.apply_chat_template
    full = render(messages, tokenize=False)
    eos = tokenizer.eos_token
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = render(messages[:i], tokenize=False, add_generation_prompt=True)
        upto = render(messages[: i + 1], tokenize=False)
        if not (upto.startswith(prompt) and full.startswith(upto)):
            raise ForgeError(
                "the chat template renders earlier turns differently once later turns follow, so the assistant-only "
                "loss mask cannot be taken from its renderings; add {% generation %}...{% endgeneration %} around "
                "each assistant reply and its end-of-turn token"
            )
        reply = upto[len(prompt) :]
        end = reply.rfind(eos)
        if end < 0 or message["content"] not in reply[:end]:
            after = reply.partition(message["content"])[2][:24]
            raise ForgeError(
                f"the chat template does not end an assistant turn with the EOS token {eos!r} after the reply "
                f"(it renders {reply[:80]!r}, the reply followed by {after!r}); llama.cpp stops only on EOS. Where "
                "the turn ends with its own token (Gemma's <end_of_turn>, Phi-3's <|end|>), make it the eos_token of "
                "the base's tokenizer_config.json, as its generation_config.json already stops on it; or add "
                "{% generation %}...{% endgeneration %} around the reply and its end-of-turn token"
            )
        spans.append((len(prompt), len(prompt) + end + len(eos)))
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = []
    for a, b in encoded["offset_mapping"]:
        inside = any(start <= a and b <= stop for start, stop in spans)
        if not inside and any(a < edge < b for span in spans for edge in span):
            raise ForgeError(f"a token of {full[a:b]!r} straddles the edge of an assistant reply: no exact loss mask")
        mask.append(int(inside))
    return {"input_ids": encoded["input_ids"], "assistant_masks": mask}


def rendered_lengths(tokenizer: Any, conversations: list[list[dict[str, str]]]) -> list[int]:
    """Token count of each conversation rendered with the chat template."""
    if not conversations:
        return []
    texts = [tokenizer.apply_chat_template(m, tokenize=False) for m in conversations]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def budget_line(steps: int, trainer: Any, examples: int) -> str:
    """How much of the Q&A set the budget covers: sft.max_steps is often a small fraction of one epoch."""
    per_step = trainer.args.per_device_train_batch_size * trainer.args.gradient_accumulation_steps * max(
        trainer.args.world_size, 1)  # fmt: skip
    if steps <= 0:
        steps = -(-examples // per_step) * math.ceil(trainer.args.num_train_epochs)
    return (f"{steps:,} steps x {per_step} examples = {steps * per_step / max(examples, 1):.2f} epochs of the "
            f"{examples:,} train pairs")  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# data: train examples and the held-out Q&A


def load_data(cfg: ForgeConfig, tokenizer: Any, qa: QASet) -> tuple[list[Example], list[dict[str, Any]], dict]:
    """(training examples, held-out Q&A records with their prompt, data report)."""
    s = cfg.sft
    train, report = read_jsonl(  # sft.max_examples chosen first: only the lines it keeps are tokenized
        qa.train, s.system_prompt, lambda m: rendered_lengths(tokenizer, [m])[0], s.max_seq_length,
        limit=s.max_examples, seed=cfg.seed,
    )  # fmt: skip
    result = report.to_dict()
    if report.beyond_cap:
        result["capped_to"] = s.max_examples
    held_out = records.read_held_out(qa.held_out, s.system_prompt)
    result.update(qa_set=qa.kind, train_examples=len(train), eval_examples=len(held_out), guidance=guidance(len(train)))
    (log.warning if len(train) < 10_000 else log.info)("sft: %s", result["guidance"])
    return train, held_out, result


# ----------------------------------------------------------------------------------------------------------------
# model, trainer


def load_model(base: Path, scfg: SFTConfig) -> tuple[Any, Any]:
    """(model, peft LoraConfig or None) for the mode."""
    import torch
    from transformers import AutoModelForCausalLM

    if scfg.mode == "qlora":
        from peft import prepare_model_for_kbit_training
        from transformers import BitsAndBytesConfig

        quant = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )  # fmt: skip
        device_map = {"": 0} if torch.cuda.is_available() else "cpu"
        model = AutoModelForCausalLM.from_pretrained(base, quantization_config=quant, device_map=device_map)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=scfg.gradient_checkpointing)
    else:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if scfg.mode == "full":
        return model, None
    from peft import LoraConfig

    lora = LoraConfig(
        r=scfg.lora_r, lora_alpha=scfg.lora_alpha, lora_dropout=scfg.lora_dropout,
        target_modules=scfg.lora_target_modules, bias="none", task_type="CAUSAL_LM",
    )  # fmt: skip
    return model, lora


class StepLogger:
    """A TrainerCallback (built lazily: transformers is slow to import) that keeps every log and sends it to MLflow."""

    def __new__(cls, tracker: Any):
        from transformers import TrainerCallback

        class _Logger(TrainerCallback):
            def __init__(self) -> None:
                self.history: list[dict[str, Any]] = []

            def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001 - TrainerCallback's API
                numbers = {k: v for k, v in (logs or {}).items() if isinstance(v, (int, float))}
                self.history.append({"step": state.global_step, **numbers})
                if "loss" in numbers:
                    log.info("sft: step %d/%d loss %.4f lr %.3g", state.global_step, state.max_steps,
                             numbers["loss"], numbers.get("learning_rate", float("nan")))  # fmt: skip
                if tracker is not None and numbers:
                    tracker.log_metrics(numbers, step=state.global_step)

        return _Logger()


def build_trainer(
    model: Any,
    tokenizer: Any,
    examples: list[Example],
    cfg: ForgeConfig,
    output_dir: Path,
    peft_config: Any = None,
    callbacks: list[Any] | None = None,
) -> Any:
    """TRL's SFTTrainer over the conversations, loss on the assistant replies + their EOS only."""
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import SFTConfig as TRLConfig
    from trl import SFTTrainer

    from pretrain.hardware import local_hardware, resolve_precision

    s = cfg.sft
    precision = resolve_precision(s.precision, local_hardware(), setting="sft.precision")
    template = training_chat_template(tokenizer)
    args = TRLConfig(
        output_dir=str(output_dir),
        max_length=s.max_seq_length,
        assistant_only_loss=template is not None,  # labels -100 outside the {% generation %} spans (module doc)
        packing=False,
        per_device_train_batch_size=s.micro_batch_size,
        gradient_accumulation_steps=s.grad_accum_steps,
        learning_rate=s.lr,
        num_train_epochs=s.epochs,
        max_steps=s.max_steps,
        lr_scheduler_type="cosine",
        warmup_steps=s.warmup_ratio,  # transformers 5: a value below 1 is a ratio of the total steps
        logging_steps=s.log_every,
        logging_first_step=True,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",  # we log to MLflow ourselves (StepLogger), under the pipeline run
        seed=cfg.seed,
        data_seed=cfg.seed,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        use_cpu=not torch.cuda.is_available(),
        activation_checkpointing=s.gradient_checkpointing,  # transformers 5 name of gradient_checkpointing
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    if template is not None:
        train_tokenizer = _with_template(tokenizer, template)
        dataset = Dataset.from_list([{"messages": e.messages} for e in examples])
    else:  # a base model's own template: tokenized here, TRL builds the labels from assistant_masks
        train_tokenizer = tokenizer
        dataset = Dataset.from_list([assistant_mask(tokenizer, e.messages) for e in examples])
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=train_tokenizer, peft_config=peft_config,
        callbacks=callbacks,
    )  # fmt: skip
    trainer.remove_callback(PrinterCallback)  # logs go to MLflow and train_history.jsonl, not raw dicts on stdout
    return trainer


def _with_template(tokenizer: Any, template: str) -> Any:
    import copy

    clone = copy.deepcopy(tokenizer)  # the shipped tokenizer keeps its template; only the training copy is marked
    clone.chat_template = template
    return clone


# ----------------------------------------------------------------------------------------------------------------
# export


def merge_adapter(base: Path, adapter_dir: Path) -> Any:
    """The base at its saved precision with the LoRA adapter merged into its weights."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()


def copy_tokenizer_files(base: Path, out_dir: Path) -> list[str]:
    copied = []
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copy2(base / name, out_dir / name)
            copied.append(name)
    return copied


def export(trainer: Any, base: Path, stage_dir: Path, mode: str) -> None:
    if mode == "full":
        model = trainer.model
    else:
        with atomic_path(stage_dir / "adapter") as tmp:
            trainer.model.save_pretrained(tmp)
        model = merge_adapter(base, stage_dir / "adapter")
    with atomic_path(stage_dir / "model") as tmp:
        model.save_pretrained(tmp)
        copy_tokenizer_files(base, tmp)


def sample_answers(model_dir: Path, held_out: list[dict[str, Any]], n: int = SAMPLE_QUESTIONS) -> list[dict[str, Any]]:
    """Greedy answers of the exported model to the first held-out questions (does it answer in the chat format?)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for record in held_out[:n]:
        ids = tokenizer.apply_chat_template(record["messages"], add_generation_prompt=True, tokenize=False)
        inputs = tokenizer(ids, add_special_tokens=False, return_tensors="pt")
        with torch.no_grad():
            generated = model.generate(
                **inputs, max_new_tokens=SAMPLE_NEW_TOKENS, do_sample=False,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
            )  # fmt: skip
        new = generated[0, inputs["input_ids"].shape[1] :].tolist()
        out.append({
            "question": record["question"], "reference": record["answer"],
            "answer": tokenizer.decode(new, skip_special_tokens=True),
            "ended_with_eos": tokenizer.eos_token_id in new,
        })  # fmt: skip
    return out


# ----------------------------------------------------------------------------------------------------------------
# the stage body


def _sft(stage: Stage, qa: QASet) -> dict[str, float]:
    cfg, s = stage.cfg, stage.cfg.sft
    base = base_model_dir(cfg)
    start = time.time()

    # ---- tokenizer, data
    tokenizer = load_tokenizer(base)
    train, held_out, report = load_data(cfg, tokenizer, qa)
    atomic_write_json(stage.dir / "data_report.json", report)
    atomic_write_jsonl(stage.dir / "sft_train.jsonl", [{"messages": e.messages, **e.meta} for e in train])

    # ---- model and trainer
    model, peft_config = load_model(base, s)
    logger = StepLogger(stage.tracker)
    with tempfile.TemporaryDirectory(dir=stage.dir, prefix=".trainer-") as workdir:
        trainer = build_trainer(model, tokenizer, train, cfg, Path(workdir), peft_config, [logger])
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in trainer.model.parameters())
        log.info("sft: %s mode, %d examples, %s of %s parameters trainable", s.mode, len(train), f"{trainable:,}",
                 f"{total:,}")  # fmt: skip
        log.info("sft: %s", budget_line(trainer.state.max_steps or trainer.args.max_steps, trainer, len(train)))
        result = trainer.train()
        # ---- export
        export(trainer, base, stage.dir, s.mode)
    atomic_write_jsonl(stage.dir / "train_history.jsonl", logger.history)
    samples = sample_answers(stage.dir / "model", held_out)
    atomic_write_json(stage.dir / "samples.json", samples)

    losses = [h["loss"] for h in logger.history if "loss" in h]
    return {
        "train_examples": len(train),
        "eval_examples": len(held_out),
        "skipped": report["skipped"],
        "steps": result.global_step,
        "train_loss": result.training_loss,
        "first_loss": losses[0] if losses else float("nan"),
        "last_loss": losses[-1] if losses else float("nan"),
        "trainable_parameters": trainable,
        "total_parameters": total,
        "samples_ended_with_eos": sum(x["ended_with_eos"] for x in samples),
        "seconds": round(time.time() - start, 3),
    }
