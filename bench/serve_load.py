"""A short, bounded load test of an OpenAI-compatible server on loopback: N chat requests, C at a time.

    .venv/bin/python bench/serve_load.py --api-base http://127.0.0.1:8080/v1 --model forge-model -n 8 -c 8

Reports errors, p50/p95 latency (seconds) and generated tokens/s (completion tokens over the wall time).
Refuses any host but loopback.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

QUESTIONS = ["What is a list?", "How do I open a file?", "Explain dict.get.", "What does yield do?"]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def load_test(api_base: str, model: str, n: int = 8, concurrency: int = 8, max_tokens: int = 32,
              api_key: str | None = None, timeout: float = 120.0) -> dict[str, Any]:  # fmt: skip
    if urlparse(api_base).hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"refusing to load-test {api_base}: loopback only")
    if not 1 <= n <= 256:
        raise SystemExit("-n must be between 1 and 256")
    from openai import OpenAI

    client = OpenAI(base_url=api_base, api_key=api_key or "none", timeout=timeout, max_retries=0)

    def one(i: int) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            resp = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                max_tokens=max_tokens,
                temperature=0.7,
                seed=i,
            )
            return {"ok": True, "latency": time.perf_counter() - start, "tokens": resp.usage.completion_tokens}
        except Exception as exc:  # noqa: BLE001 - counted and reported
            return {"ok": False, "latency": time.perf_counter() - start, "error": str(exc)}

    wall = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, range(n)))
    wall = time.perf_counter() - wall
    ok = [r for r in results if r["ok"]]
    latencies = [r["latency"] for r in ok] or [0.0]
    tokens = sum(r["tokens"] for r in ok)
    return {
        "requests": n,
        "concurrency": concurrency,
        "errors": n - len(ok),
        "error_messages": [r["error"] for r in results if not r["ok"]][:3],
        "p50_s": round(statistics.median(latencies), 3),
        "p95_s": round(_percentile(latencies, 0.95), 3),
        "completion_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1) if wall > 0 else 0.0,
        "wall_s": round(wall, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api-base", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--model", default="forge-model")
    parser.add_argument("-n", type=int, default=8)
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    print(json.dumps(load_test(args.api_base, args.model, args.n, args.concurrency, args.max_tokens), indent=2))


if __name__ == "__main__":
    main()
