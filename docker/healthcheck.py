"""Container healthcheck: healthy when FORGE_HEALTH_URL answers HTTP below 500 (a 401 from a server that requires an
API key still means it is up), unhealthy on a 5xx (llama-server's /health answers 503 while it loads the model), when
nothing listens or the request times out."""

import os
import sys
import urllib.error
import urllib.request

url = os.environ.get("FORGE_HEALTH_URL", "http://127.0.0.1:8080/health")
try:
    with urllib.request.urlopen(url, timeout=4) as resp:
        code = resp.status
except urllib.error.HTTPError as exc:
    code = exc.code
except OSError as exc:
    print(f"unhealthy: {url}: {exc}")
    sys.exit(1)
print(f"{url}: HTTP {code}")
sys.exit(0 if code < 500 else 1)
