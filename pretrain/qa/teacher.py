"""Q&A pairs written by a teacher model, kept only where the text they came from supports them.

`qa.teacher` names the teacher: a local GGUF, which Forge serves with its own llama-server for the length of the
stage, or any OpenAI-compatible endpoint (`qa.teacher.url`: vLLM on a GPU, a server the user runs; its key from the
environment variable `qa.teacher.api_key_env`, never from the config or the command line). As Meta's
synthetic-data-kit and InstructLab do, the kept documents are cut into chunks, the teacher writes questions and
answers per chunk with the sentence that supports each, and a check keeps a pair only when

  - its evidence is quoted from the chunk (found in it, whitespace and case aside), and
  - at least `qa.teacher.min_support` of its answer's content words are words of the chunk

so an answer the teacher invented is rejected whatever it sounds like (tests/test_qa_teacher.py proves it). Chunks
of train documents give train pairs, chunks of val and test documents held-out pairs: the teacher never reads
held-out text for a train pair. Each chunk's reply is cached under runs/<run>/.cache/teacher/ by the teacher's
identity, the prompt and the chunk, so a re-run asks nothing it asked before.

    pairs, report = teacher_pairs(cfg, documents)   # documents: the data stage's kept ones, with their split
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import socket
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from forge import ForgeError
from forge.config import ForgeConfig, TeacherConfig
from forge.io import atomic_write_json, read_json_object
from forge.paths import run_dir
from forge.progress import progress
from pretrain.data.words import est_tokens, segment
from pretrain.qa.extract import normalize

log = logging.getLogger("forge.qa")

SYSTEM = ("You write question-answer pairs that train an assistant on a collection of documents. Use only the text "
          "you are given; write in its language.")  # fmt: skip
INSTRUCTION = (
    "Write up to {n} questions that a reader of this documentation would ask and that the text answers. For each, "
    "give a short answer taken from the text and copy, word for word, the sentence of the text that supports it. "
    'Reply with JSON only: {{"pairs": [{{"question": "...", "answer": "...", "evidence": "..."}}]}}'
)
MAX_CHARS = {"question": 200, "answer": 400, "evidence": 400}


def schema(pairs: int) -> dict[str, Any]:
    """The reply's JSON schema; servers that take one (llama-server, vLLM) decode only replies that fit it, bounded
    in items and lengths so a looping model still closes its JSON."""
    fields = {k: {"type": "string", "minLength": 1, "maxLength": n} for k, n in MAX_CHARS.items()}
    item = {"type": "object", "required": list(MAX_CHARS), "properties": fields}
    array = {"type": "array", "items": item, "minItems": 1, "maxItems": pairs}
    return {"type": "object", "properties": {"pairs": array}, "required": ["pairs"]}


STOP_WORDS = frozenset({"the", "a", "an", "of", "to", "in", "on", "at", "for", "and", "or", "is", "are", "was", "were",
                        "be", "by", "with", "as", "it", "its", "this", "that", "from", "can", "you", "your", "not",
                        "no"})  # fmt: skip
SAMPLES = 10


@dataclass(frozen=True)
class Chunk:
    doc_id: str
    split: str
    source: str | None
    text: str


# ----------------------------------------------------------------------------------------------------------------
# chunks


def chunks(documents: Iterator[dict[str, Any]], max_tokens: int) -> list[Chunk]:
    """Each document's paragraphs grouped into chunks of at most `max_tokens` estimated tokens."""
    out = []
    for doc in documents:
        current: list[str] = []
        size = 0
        for paragraph in (p.strip() for p in re.split(r"\n\s*\n", doc["text"])):
            tokens = est_tokens(paragraph)
            if current and size + tokens > max_tokens:
                out.append(Chunk(doc["id"], doc["split"], doc.get("source"), "\n\n".join(current)))
                current, size = [], 0
            if paragraph:
                current.append(paragraph)
                size += tokens
        if current:
            out.append(Chunk(doc["id"], doc["split"], doc.get("source"), "\n\n".join(current)))
    return out


def chosen(all_chunks: list[Chunk], limit: int, seed: int) -> list[Chunk]:
    """A stable sample of at most `limit` chunks (by a hash of each chunk's text and the seed)."""
    key = lambda c: xxhash.xxh64_intdigest(c.text.encode(), seed=seed & 0xFFFFFFFFFFFFFFFF)  # noqa: E731
    return sorted(all_chunks, key=key)[:limit]


# ----------------------------------------------------------------------------------------------------------------
# the check: is the answer in the text?


def content_words(text: str) -> set[str]:
    return {w for w in (t.lower().strip(".,;:!?()[]{}\"'`") for t in segment(text)) if w and w not in STOP_WORDS
            and (len(w) >= 3 or not w.isascii())}  # fmt: skip


def rejection(question: str, answer: str, evidence: str, chunk: str, min_support: float) -> str | None:
    """Why a proposed pair is rejected (None: kept)."""
    if not question.strip().endswith(("?", "？")):
        return "not a question"
    if not answer.strip():
        return "empty answer"
    if not evidence.strip() or normalize(evidence).lower() not in normalize(chunk).lower():
        return "evidence not quoted from the text"
    words = content_words(answer)
    if not words:
        return "answer has no content words"
    support = len(words & content_words(chunk)) / len(words)
    if support < min_support:
        return f"answer not supported by the text (below {min_support:.0%} of its words)"
    return None


# ----------------------------------------------------------------------------------------------------------------
# the teacher


def identity(tcfg: TeacherConfig) -> str:
    """What the teacher is, for the cache: the GGUF's sha256, or the endpoint and its model name."""
    if tcfg.url:
        return f"url:{tcfg.url}|model:{tcfg.model}"
    from forge.hashing import sha256_file

    gguf = Path(tcfg.model).expanduser()
    if not gguf.is_file() or gguf.suffix != ".gguf":
        raise ForgeError(f"qa.teacher.model={tcfg.model!r}: not a .gguf file; give a local GGUF, or qa.teacher.url "
                         "for an OpenAI-compatible endpoint (and its model name in qa.teacher.model)")  # fmt: skip
    return f"gguf:{sha256_file(gguf)}"


@contextlib.contextmanager
def endpoint(tcfg: TeacherConfig, logs: Path) -> Iterator[tuple[str, str, str]]:
    """(base URL, model name, API key) of the teacher; a local GGUF is served by llama-server on a free loopback port
    while the block runs (its key, if any, from the environment: never on a command line)."""
    key = os.environ.get(tcfg.api_key_env, "") or "none"
    if tcfg.url:
        yield tcfg.url.rstrip("/"), tcfg.model, key
        return
    from models.llama_server import ServerProcess, llama_server_command

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = llama_server_command(Path(tcfg.model).expanduser(), alias="forge-teacher", n_ctx=tcfg.context,
                                   parallel=tcfg.parallel)  # fmt: skip
    with ServerProcess([*command, "--host", "127.0.0.1", "--port", str(port)], port, "forge-teacher",
                       log_path=logs / "teacher-server.log", ready_timeout=300) as server:  # fmt: skip
        yield server.base_url, "forge-teacher", "none"


def ask(client: Any, model: str, chunk: Chunk, tcfg: TeacherConfig) -> str:
    """The teacher's reply to one chunk, as JSON forced by the schema where the server supports it."""
    prompt = f'Text:\n"""\n{chunk.text}\n"""\n\n{INSTRUCTION.format(n=tcfg.pairs_per_chunk)}'
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
    shape = {"type": "json_schema", "json_schema": {"name": "qa_pairs", "schema": schema(tcfg.pairs_per_chunk)}}
    response = client.chat.completions.create(model=model, messages=messages, temperature=tcfg.temperature,
                                              max_tokens=tcfg.max_tokens, response_format=shape)  # fmt: skip
    return response.choices[0].message.content or ""


def parse(reply: str) -> list[dict[str, str]] | None:
    """The pairs in a reply (a JSON object, possibly fenced); None when it is not one."""
    text = re.sub(r"^```(?:json)?\s*|\s*```$", "", reply.strip())
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    pairs = obj.get("pairs") if isinstance(obj, dict) else None
    if not isinstance(pairs, list):
        return None
    return [{k: str(p.get(k, "")) for k in ("question", "answer", "evidence")} for p in pairs if isinstance(p, dict)]


def teacher_pairs(cfg: ForgeConfig, documents: Iterator[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict]:
    """The teacher's kept pairs (corpus records: question, answer, qtype "teacher", source with the split) and the
    report: chunks asked and cached, pairs proposed, kept and rejected by reason, with samples of each."""
    tcfg = cfg.qa.teacher
    assert tcfg is not None
    picked = chosen(chunks(documents, tcfg.chunk_tokens), tcfg.max_chunks, cfg.seed)
    who = identity(tcfg)
    cache = run_dir(cfg) / ".cache" / "teacher"
    paths = {c: cache / f"{_cache_key(who, c, tcfg)}.json" for c in picked}
    replies = {c: (read_json_object(p) or {}).get("reply") for c, p in paths.items()}
    missing = [c for c in picked if not isinstance(replies[c], str)]
    if missing:  # the teacher is started only when something is not in the cache
        with endpoint(tcfg, run_dir(cfg) / "qa") as (base_url, model, key):
            from openai import OpenAI

            client = OpenAI(base_url=base_url, api_key=key, timeout=tcfg.timeout_s, max_retries=1)

            def reply_of(chunk: Chunk) -> tuple[Chunk, str]:
                reply = ask(client, model, chunk, tcfg)
                atomic_write_json(paths[chunk], {"reply": reply, "doc_id": chunk.doc_id, "teacher": who})
                return chunk, reply

            with ThreadPoolExecutor(max(1, tcfg.parallel)) as pool:
                for chunk, reply in progress(pool.map(reply_of, missing), total=len(missing), desc="qa: teacher",
                                             unit="chunk", logger=log):  # fmt: skip
                    replies[chunk] = reply
    stats: Counter[str] = Counter()
    kept: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    for chunk in picked:
        _judge(chunk, str(replies[chunk]), tcfg, stats, kept, rejected)
    report = {
        "teacher": who, "chunks": len(picked), "asked": len(missing), "cached": len(picked) - len(missing),
        "proposed": stats["proposed"], "kept": len(kept),
        "rejected": {k.removeprefix("rejected: "): v for k, v in stats.items() if k.startswith("rejected: ")},
        "kept_samples": kept[:SAMPLES], "rejected_samples": rejected[:SAMPLES],
    }  # fmt: skip
    log.info("qa: teacher %s: %d chunks (%d from the cache), %d pairs proposed, %d kept", who, len(picked),
             len(picked) - len(missing), stats["proposed"], len(kept))  # fmt: skip
    return kept, report


def _judge(chunk: Chunk, reply: str, tcfg: TeacherConfig, stats: Counter[str], kept: list, rejected: list) -> None:
    proposed = parse(reply)
    if proposed is None:
        stats["rejected: reply is not the JSON asked for"] += 1
        rejected.append({"doc_id": chunk.doc_id, "reason": "reply is not the JSON asked for", "reply": reply[:300]})
        return
    for p in proposed:
        stats["proposed"] += 1
        why = rejection(p["question"], p["answer"], p["evidence"], chunk.text, tcfg.min_support)
        if why:
            stats[f"rejected: {why}"] += 1
            rejected.append({**p, "doc_id": chunk.doc_id, "reason": why})
            continue
        source = {"kind": "corpus", "doc_id": chunk.doc_id, "split": chunk.split, "heading": None,
                  "path": chunk.source, "teacher_evidence": normalize(p["evidence"])}  # fmt: skip
        kept.append({"question": normalize(p["question"]), "answer": normalize(p["answer"]), "qtype": "teacher",
                     "source": source})  # fmt: skip


def _cache_key(teacher: str, chunk: Chunk, tcfg: TeacherConfig) -> str:
    """The reply's key: the teacher, everything it is asked (the prompt, the schema, the settings) and the chunk."""
    what = [teacher, SYSTEM, INSTRUCTION, schema(tcfg.pairs_per_chunk), tcfg.temperature, tcfg.max_tokens, chunk.text]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()
