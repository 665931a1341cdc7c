"""What happens to a trained model, as the run config says: `forge eval` (bits per byte, domain tasks, the red
flags' thresholds), `forge quantize`, the registry and `forge serve`. Part of the run config (forge/config.py),
which re-exports every name here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from forge.config_section import Section, refuse_gone

# ----------------------------------------------------------------------------------------------------------------
# evaluation


class EvalConfig(Section):
    """`forge eval`: bits per byte, domain tasks, generations and the red flags' thresholds (see evaluation/)."""

    ppl_window: int | None = None  # tokens; None: each model's own context length
    ppl_stride: int | None = None  # None: half the window
    # Bits per byte is scored on items of test text: every test document cut into pieces of at most text_item_bytes
    # (at a paragraph, line or word), text_items of them drawn by a stable hash of their text. Every model reads the
    # same pieces through its own tokenizer, so two evaluations pair up item by item; the gate's bits-per-byte rules
    # need registry min_items (30) of them, and a few long documents give as many as many short ones.
    text_items: int = Field(200, ge=1)
    text_item_bytes: int = Field(1024, ge=64)
    qa_max_examples: int = Field(200, ge=1)  # held-out Q&A pairs answered by generation (the slow part)
    mc_max_examples: int = Field(1000, ge=1)  # multiple-choice items: cheap to score, and 200 leave +-0.03 of noise
    mc_choices: int = Field(4, ge=2)
    chat: bool | None = None  # prompt through the chat template; None: when the model has one and is not pretrain's
    # Solved examples of the same question type before each question to a base model (lm-eval's num_fewshot), as
    # many as fit in half its context: pretraining never showed it the Question/Answer format. Chat models get none.
    base_fewshot: int = Field(3, ge=0)
    prompts: list[str] = []  # generation prompts; empty: the first prompt_tokens of generation_prompts test documents
    generation_prompts: int = Field(8, ge=1)
    prompt_tokens: int = Field(32, ge=1)
    max_new_tokens: int = Field(64, ge=1)
    temperature: float = Field(0.8, ge=0.0)  # sampled generations (0: greedy), seeded with the run's seed
    top_k: int = Field(50, ge=0)
    random_baseline: bool = True  # also score a random-init model of the same shape (HF targets): the floor
    reference: str | None = None  # model dir or .gguf for ppl_drift; None: sft -> pretrain model, gguf -> original
    benchmarks: list[str] = []  # lm-eval tasks (forge_qa_mc is the shipped domain task); --benchmarks overrides
    benchmark_limit: int | None = Field(None, ge=1)  # lm-eval examples per task (None: all)
    min_benchmark: dict[str, float] = {}  # task -> lowest acceptable score (a red flag each)
    repetition_ngram: int = Field(4, ge=1)
    max_repeated_ngram_rate: float = 0.5
    min_distinct_2: float = 0.2
    max_ppl_drift: float = 0.10  # relative bits-per-byte increase against the reference model
    # ... against the base model of a fine-tune (SFT's default reference): SFT on Q&A trades some raw-text
    # prediction for instruction following; more than this on the test split is forgetting the domain's text.
    max_finetune_ppl_drift: float = 0.25
    max_val_ppl_rise: float = 0.05  # last val perplexity of the training history over its minimum
    memorisation_docs: int = Field(20, ge=1)  # training and test documents continued greedily
    memorisation_prefix: int = Field(32, ge=1)
    memorisation_suffix: int = Field(32, ge=1)
    max_memorisation_gap: float = 0.2  # verbatim continuation rate, train minus test
    min_generation_tokens: int = Field(4, ge=0)  # shorter generations count as degenerate
    max_degenerate_rate: float = 0.5  # incoherence: share of degenerate generations allowed at low perplexity
    incoherence_ppl_ratio: float = Field(1.0, gt=0)  # "low perplexity": bits per byte below this x the unigram's
    max_uniform_ppl_ratio: float = Field(0.5, gt=0)  # untrained: test perplexity / vocabulary size at or above it

    @model_validator(mode="before")
    @classmethod
    def _bytes_became_items(cls, data: Any) -> Any:
        why = ("the test text is now scored as items (the gate judges each rule on at least registry min_items of "
               "them); use eval.text_items (how many) and eval.text_item_bytes (the largest item), e.g. --set "
               "eval.text_items=100")  # fmt: skip
        return refuse_gone(data, "eval", {"max_test_bytes": why})


# ----------------------------------------------------------------------------------------------------------------
# quantization, registry, serving


class QuantizeConfig(Section):
    """`forge quantize`: GGUF types by llama.cpp name (f16 is always written: it is the quantizer's input),
    bitsandbytes loading checks, and how each artifact is measured (see serve/quantize.py)."""

    gguf_types: list[str] = ["f16", "q8_0", "q4_k_m"]
    bitsandbytes: list[Literal["int8", "nf4"]] = ["int8", "nf4"]
    max_eval_tokens: int = Field(50_000, ge=2)  # test-split tokens for perplexity
    ppl_window: int | None = Field(None, ge=2)  # None: the model's context length
    ppl_stride: int | None = Field(None, ge=1)  # None: half the window
    generation_prompts: int = Field(4, ge=1)  # test documents whose first tokens prompt the greedy generations
    max_new_tokens: int = Field(32, ge=1)  # greedy tokens per prompt (agreement and decode tokens/s)
    threads: int | None = Field(None, ge=1)  # CPU threads for llama.cpp and torch; None: every core
    # Relative perplexity increase over the f16 GGUF above which the report warns (the acceptance bars).
    max_ppl_drift: dict[str, float] = {"q8_0": 0.01, "q4_k_m": 0.05}


class RegistryConfig(Section):
    model_name: str = "forge-model"
    tracking_uri: str | None = None  # None: MLFLOW_TRACKING_URI, else sqlite under the runs directory
    experiment: str = "forge"
    gate_policy: str = "configs/policies/gate.yaml"


class ServeConfig(Section):
    # llamacpp: llama.cpp's own llama-server; llama-cpp-python: its Python server, one request at a time (kept as a
    # fallback); vllm: the HF directory on a GPU. auto: vllm where CUDA and vLLM are there, else llamacpp.
    backend: Literal["auto", "llamacpp", "llama-cpp-python", "vllm"] = "auto"
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    ui_port: int = Field(7860, ge=1, le=65535)
    gguf_type: str = "q4_k_m"
    n_ctx: int | None = None  # per request slot; None: the model's context length
    # Requests llama-server decodes together (continuous batching); more wait in its queue. On CPU one decode step
    # reads all the weights once for the whole batch, so throughput grows with the batch until the cores are busy
    # computing, while each slot costs n_ctx tokens of KV cache and each request's latency grows with the batch
    # (bench/serve_load.py --side-by-side --parallel N measures both on a host). The gateway lets this many requests
    # at any backend at once (vLLM on a GPU batches far more: raise it there); `queue` more wait for one.
    parallel: int = Field(4, ge=1, le=256)
    threads: int | None = Field(None, ge=1)  # None: the cores this process may run on
    api_key_env: str = "FORGE_API_KEY"  # the server requires this key when the variable is set
    # serve/gateway.py, the one front door of every backend, enforces the rest. Browser pages of these origins (e.g.
    # "https://chat.example.com", or "*" for any) may call the API; any other page's request is refused (403) and
    # gets no CORS grant, so a page the operator happens to open cannot make the model generate or read its answers.
    cors_origins: list[str] = []
    # Host names the server answers to besides the address it binds (and 127.0.0.1/localhost/[::1] on loopback):
    # any other Host is refused (421), which stops DNS rebinding. Bound to 0.0.0.0, IP literals and one-label names
    # (a container's) are accepted too, and a dotted name (api.example.com) must be listed here; "*" accepts any.
    allowed_hosts: list[str] = []
    queue: int = Field(16, ge=0, le=4096)  # requests waiting for one of the `parallel` slots; more get 503 at once
    request_timeout_s: float = Field(300.0, gt=0)  # arrival to last byte, queue included; then 504 (or a cut stream)
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)  # larger bodies get 413 before they are read
    max_json_depth: int = Field(32, ge=2, le=512)  # arrays/objects nested deeper get 400 (checked without recursion)
    max_n: int = Field(1, ge=1, le=16)  # choices per request (`n`): each one is a whole generation in a slot
    max_message_chars: int = Field(8000, ge=1)
    max_history_chars: int = Field(32_000, ge=1)
    max_new_tokens: int = Field(512, ge=1, le=4096)
    temperature: float = Field(0.7, ge=0.0, le=2.0)

    @field_validator("cors_origins")
    @classmethod
    def _origins_are_origins(cls, origins: list[str]) -> list[str]:
        """A browser sends `scheme://host[:port]` and nothing else: a path or a trailing slash would never match."""
        for origin in origins:
            scheme, sep, rest = origin.partition("://")
            if origin != "*" and (scheme not in ("http", "https") or not sep or not rest or "/" in rest):
                raise ValueError(
                    f"serve.cors_origins: {origin!r} is not an origin; write e.g. https://chat.example.com"
                )
        return origins
