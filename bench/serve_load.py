"""A short, bounded load test of an OpenAI-compatible server on loopback: N chat requests, C at a time.

    .venv/bin/python bench/serve_load.py --api-base http://127.0.0.1:8080/v1 --model forge-model -n 8 -c 8
    nice -n 10 .venv/bin/python bench/serve_load.py --side-by-side          # old server against new, one run

Reports errors, p50/p95 latency (seconds) and generated tokens/s (completion tokens over the wall time).
Refuses any host but loopback.

    nice -n 10 .venv/bin/python bench/serve_load.py --hostile --seconds 60          # issue #40's probes + overload

--hostile starts llama-server with the SmolLM2 GGUF (--gguf) behind serve.gateway (--parallel 4, --queue 16) and
prints each probe's outcome (a foreign Origin, a wrong Host, a 20 MB body, JSON 100,000 deep, max_tokens 10^9, 100
clients at once, the next request's first token after every slot's client hung up), then keeps --clients (2 x
(parallel + queue)) clients asking back to back for --seconds, each waiting Retry-After on a 503, and prints the
p50/p95 latency of the admitted requests and the share refused.

--side-by-side builds one model (a random-init configs/125m.yaml, as bench/serve_cpu.py does; speed does not depend
on the weights), quantizes it to Q4_K_M, starts the old server (llama-cpp-python's, one request at a time) and the
new one (`forge serve`'s: llama-server with --parallel slots behind serve.gateway), and sends each the same 16
requests at concurrency 1 and then 8, the two servers measured in turn at each level. It prints aggregate tokens/s
and p50/p95 for each, the new server's concurrency-8 throughput over its own concurrency-1 throughput (goal >= 2.5x
on 2 cores), its p50 against the old server's, and how long the sha256 check `forge serve` runs before every start
takes on that GGUF.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
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


def side_by_side(config: str, n: int, levels: list[int], max_tokens: int, parallel: int, threads: int | None,
                 n_ctx: int, json_path: Path | None) -> dict[str, Any]:  # fmt: skip
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from serve_cpu import random_model_dir

    from forge.hashing import sha256_file
    from serve.backends import (
        ServerProcess,
        gateway_command,
        llama_server_command,
        llamacpp_python_command,
        serving_threads,
    )
    from serve.gguf_export import export_gguf
    from serve.quantize import quantize_gguf

    threads = serving_threads(threads)
    results: dict[str, Any] = {"config": config, "requests": n, "max_tokens": max_tokens, "threads": threads,
                               "parallel": parallel, "n_ctx_per_request": n_ctx, "servers": {}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="forge-bench-load-") as tmp:
        work = Path(tmp)
        f16, gguf = work / "model-f16.gguf", work / "model-q4_k_m.gguf"
        export_gguf(random_model_dir(config, work / "model"), f16, name="bench")
        quantize_gguf(f16, gguf, "q4_k_m", threads=threads)
        f16.unlink()
        start = time.perf_counter()
        sha256_file(gguf)
        hash_s = time.perf_counter() - start
        size_mb = gguf.stat().st_size / 1e6
        results["gguf_mb"] = round(size_mb, 1)
        results["sha256_s"] = round(hash_s, 3)
        print(f"{config}: Q4_K_M {size_mb:.1f} MB, sha256 in {hash_s:.3f}s ({size_mb / hash_s:,.0f} MB/s)", flush=True)
        old_port, new_port = _free_port(), _free_port()
        servers = {
            "old: llama-cpp-python": ServerProcess(
                llamacpp_python_command(gguf, old_port, "bench", n_ctx, threads=threads), old_port, "bench",
                log_path=work / "old.log", ready_timeout=300,
            ),
            f"new: llama-server x{parallel}": ServerProcess(
                gateway_command(llama_server_command(gguf, "bench", n_ctx, parallel, threads), new_port), new_port,
                "bench", log_path=work / "new.log", ready_timeout=300,
            ),
        }  # fmt: skip
        # Both up at once, idle but for the one being measured, and measured in turn at each level: on a shared
        # machine the load drifts, and runs next to each other in time see the same load.
        with contextlib.ExitStack() as stack:
            for server in servers.values():
                stack.enter_context(server)
                load_test(server.base_url, "bench", n=2, concurrency=1, max_tokens=4)  # warm up
            for c in levels:
                for name, server in servers.items():
                    run = load_test(server.base_url, "bench", n=n, concurrency=c, max_tokens=max_tokens)
                    results["servers"].setdefault(name, {})[c] = run
                    print(f"{name:<24} c={c}: {run}", flush=True)
    old, new = results["servers"].values()
    lo, hi = min(levels), max(levels)
    scaling = new[hi]["tokens_per_s"] / max(new[lo]["tokens_per_s"], 1e-9)
    results["goal"] = {
        f"new_c{hi}_over_new_c{lo}_throughput": round(scaling, 2),
        f"new_c{hi}_p50_s": new[hi]["p50_s"],
        f"old_c{hi}_p50_s": old[hi]["p50_s"],
        "met": scaling >= 2.5 and new[hi]["p50_s"] < old[hi]["p50_s"],
    }
    print(f"\n{'server':<24} {'c':>3} {'tokens/s':>9} {'p50 s':>7} {'p95 s':>7} {'errors':>6}")
    for name, runs in results["servers"].items():
        for c, r in runs.items():
            print(f"{name:<24} {c:>3} {r['tokens_per_s']:>9.1f} {r['p50_s']:>7.2f} {r['p95_s']:>7.2f} {r['errors']:>6}")
    verdict = "met" if results["goal"]["met"] else "NOT met"
    print(f"new server: c={hi} throughput {scaling:.2f}x its c={lo} (goal >= 2.5x); c={hi} p50 "
          f"{new[hi]['p50_s']:.2f}s vs old {old[hi]['p50_s']:.2f}s; goal {verdict}")  # fmt: skip
    if json_path:
        json_path.write_text(json.dumps(results, indent=2) + "\n")
    return results


# ----------------------------------------------------------------------------------------------------------------
# --hostile: the gateway's probes (issue #40) and a sustained overload, against `forge serve`'s own server


SMOLLM2 = Path.home() / ".cache" / "forge" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def hostile(gguf: Path, seconds: float, parallel: int, queue: int, n_ctx: int, max_tokens: int, clients: int,
            threads: int | None, json_path: Path | None) -> dict[str, Any]:  # fmt: skip
    """Start llama-server behind serve.gateway (serve.parallel, serve.queue) on `gguf`, run every probe, then
    `clients` clients asking back to back for `seconds` (each honouring Retry-After, as the openai client does)."""
    import asyncio

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from forge.config import ServeConfig
    from serve.backends import ServerProcess, gateway_command, llama_server_command

    serve = ServeConfig(parallel=parallel, queue=queue, request_timeout_s=max(120.0, seconds))
    port = _free_port()
    server = llama_server_command(gguf, "bench", n_ctx, parallel, threads)
    results: dict[str, Any] = {"gguf": gguf.name, "parallel": parallel, "queue": queue, "n_ctx": n_ctx,
                               "max_tokens": max_tokens, "clients": clients, "seconds": seconds}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="forge-bench-hostile-") as tmp:
        command = gateway_command(server, port, serve=serve, n_ctx=n_ctx)
        with ServerProcess(command, port, "bench", log_path=Path(tmp) / "server.log", ready_timeout=300) as proc:
            base = proc.base_url.removesuffix("/v1")
            results["probes"] = asyncio.run(_probes(base, n_ctx, parallel))
            for name, outcome in results["probes"].items():
                print(f"{name:<34} {outcome}", flush=True)
            results["overload"] = asyncio.run(_overload(base, seconds, clients, max_tokens))
            results["overload"]["health_after"] = asyncio.run(_status(base, "GET", "/health"))
    _print_overload(results["overload"])
    if json_path:
        json_path.write_text(json.dumps(results, indent=2) + "\n")
    return results


async def _status(base: str, method: str, path: str, **kwargs: Any) -> int:
    import httpx

    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        return (await client.request(method, path, **kwargs)).status_code


def _chat(max_tokens: int, **fields: Any) -> dict[str, Any]:
    return {"model": "bench", "messages": [{"role": "user", "content": QUESTIONS[0]}], "max_tokens": max_tokens,
            **fields}  # fmt: skip


async def _probes(base: str, n_ctx: int, parallel: int) -> dict[str, str]:
    """Each probe's status (and its time where the issue asks for one)."""
    import httpx

    out: dict[str, str] = {}
    evil = {"Origin": "http://evil.example"}
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=httpx.Limits(max_connections=None)) as client:
        resp = await client.post("/v1/chat/completions", json=_chat(4), headers=evil)
        out["foreign Origin, POST"] = f"{resp.status_code}, ACAO {resp.headers.get('access-control-allow-origin')}"
        resp = await client.options("/v1/chat/completions", headers={**evil, "Access-Control-Request-Method": "POST"})
        out["foreign Origin, preflight"] = f"{resp.status_code}, ACAO {resp.headers.get('access-control-allow-origin')}"
        resp = await client.get("/v1/models", headers={"Host": "evil.example"})
        out["wrong Host"] = str(resp.status_code)
        start = time.perf_counter()
        resp = await client.post("/v1/chat/completions", content=b'{"messages": "' + b"a" * 20_000_000 + b'"}')
        out["20 MB body (sent whole)"] = f"{resp.status_code} in {time.perf_counter() - start:.3f}s"
        start = time.perf_counter()
        resp = await client.post("/v1/chat/completions", content=b"[" * 100_000 + b"]" * 100_000)
        out["JSON nested 100,000 deep"] = f"{resp.status_code} in {time.perf_counter() - start:.3f}s"
        resp = await client.post("/v1/chat/completions", json=_chat(10**9))
        out["max_tokens 10^9"] = f"{resp.status_code} ({resp.json()['error']['message'][:60]}...)"
        start = time.perf_counter()
        answers = await asyncio.gather(*(client.post("/v1/chat/completions", json=_chat(8)) for _ in range(100)))
        codes = sorted({r.status_code for r in answers})
        counts = ", ".join(f"{c}: {sum(r.status_code == c for r in answers)}" for c in codes)
        out["100 clients at once"] = f"{counts} in {time.perf_counter() - start:.1f}s"
        out["hang-up frees the slots"] = await _hang_up(client, n_ctx, parallel)
    return out


async def _hang_up(client: Any, n_ctx: int, parallel: int) -> str:
    """Fill every slot with a long stream, hang all of them up, and time the next request's first token (against
    the same request's on the idle server: the difference is what the hang-up costs)."""
    idle = await _first_token(client, time.perf_counter())
    long = _chat(n_ctx - 64, ignore_eos=True, stream=True)
    async with contextlib.AsyncExitStack() as streams:
        for _ in range(parallel):
            resp = await streams.enter_async_context(client.stream("POST", "/v1/chat/completions", json=long))
            await resp.aiter_raw().__anext__()  # generating
        hung_up = time.perf_counter()
    after = await _first_token(client, hung_up)
    return f"next request's first token {after:.2f}s after {parallel} clients hung up (idle server: {idle:.2f}s)"


async def _first_token(client: Any, since: float) -> float:
    async with client.stream("POST", "/v1/chat/completions", json=_chat(8, stream=True)) as resp:
        async for line in resp.aiter_lines():
            if '"content":"' in line:
                return time.perf_counter() - since
    raise SystemExit("the server streamed no token")


async def _overload(base: str, seconds: float, clients: int, max_tokens: int) -> dict[str, Any]:
    import httpx

    admitted: list[float] = []
    statuses: dict[int, int] = {}
    deadline = time.perf_counter() + seconds

    async def client_loop(client: Any, i: int) -> None:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            resp = await client.post("/v1/chat/completions", json={**_chat(max_tokens), "seed": i})
            statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
            if resp.status_code == 200:
                admitted.append(time.perf_counter() - start)
            elif resp.status_code == 503:
                await asyncio.sleep(float(resp.headers.get("retry-after", 1)))

    start = time.perf_counter()
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=httpx.Limits(max_connections=None)) as client:
        await asyncio.gather(*(client_loop(client, i) for i in range(clients)))
    wall = time.perf_counter() - start  # past `seconds`: the requests admitted before the end are answered
    total = sum(statuses.values())
    return {
        "requests": total,
        "statuses": statuses,
        "refused_share": round(statuses.get(503, 0) / max(total, 1), 3),
        "admitted_p50_s": round(statistics.median(admitted), 3) if admitted else None,
        "admitted_p95_s": round(_percentile(admitted, 0.95), 3) if admitted else None,
        "admitted_per_s": round(len(admitted) / wall, 2),
        "wall_s": round(wall, 1),
    }


def _print_overload(o: dict[str, Any]) -> None:
    print(f"\nsustained overload: {o['requests']} requests, statuses {o['statuses']}, refused "
          f"{o['refused_share']:.1%}; admitted p50 {o['admitted_p50_s']}s p95 {o['admitted_p95_s']}s "
          f"({o['admitted_per_s']}/s over {o['wall_s']}s); /health after: {o['health_after']}")  # fmt: skip


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--api-base", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--model", default="forge-model")
    parser.add_argument("-n", type=int, default=None, help="requests (default: 8, or 16 with --side-by-side)")
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=None, help="default: 32, or 64 with --side-by-side")
    parser.add_argument("--side-by-side", action="store_true", help="old server against new on one model")
    parser.add_argument("--config", default="configs/125m.yaml", help="--side-by-side: the random-init model shape")
    parser.add_argument("--levels", default="1,8", help="--side-by-side: the concurrency levels")
    parser.add_argument("--parallel", type=int, help="the new server's slots (--side-by-side: 8, --hostile: 4)")
    parser.add_argument("--threads", type=int, default=None, help="--side-by-side: default every core")
    parser.add_argument("--n-ctx", type=int, default=512, help="--side-by-side: context per request")
    parser.add_argument("--json", type=Path, help="--side-by-side, --hostile: also write the results here")
    parser.add_argument("--hostile", action="store_true", help="the gateway's probes, then a sustained overload")
    parser.add_argument("--gguf", type=Path, default=SMOLLM2, help="--hostile: the model served")
    parser.add_argument("--seconds", type=float, default=60, help="--hostile: how long the overload lasts")
    parser.add_argument("--queue", type=int, default=16, help="--hostile: serve.queue")
    parser.add_argument("--clients", type=int, default=None, help="--hostile: default 2 x (parallel + queue)")
    args = parser.parse_args()
    if args.hostile:
        parallel = args.parallel or 4
        hostile(args.gguf, args.seconds, parallel, args.queue, args.n_ctx, args.max_tokens or 32,
                args.clients or 2 * (parallel + args.queue), args.threads, args.json)  # fmt: skip
        return
    if args.side_by_side:
        levels = [int(c) for c in args.levels.split(",")]
        side_by_side(args.config, args.n or 16, levels, args.max_tokens or 64, args.parallel or 8, args.threads,
                     args.n_ctx, args.json)  # fmt: skip
        return
    report = load_test(args.api_base, args.model, args.n or 8, args.concurrency, args.max_tokens or 32)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    from results import recorded  # bench/results.py: the output goes to RESULTS.md too

    with recorded(__file__):
        main()
