#!/bin/sh
# `forge VERB ...` in the serve images. In a container the server and the UI must listen on every interface to be
# reachable through a published port, so `serve` and `chat` get --set serve.host=$FORGE_HOST (default 0.0.0.0)
# before the caller's own arguments (a later --set serve.host=... still wins). Publish the ports on the host's
# loopback (-p 127.0.0.1:8080:8080) or set FORGE_API_KEY / FORGE_UI_USER + FORGE_UI_PASSWORD before exposing more.
set -eu
case "${1:-}" in
    serve | chat)
        verb="$1"
        shift
        exec forge "$verb" --set "serve.host=${FORGE_HOST:-0.0.0.0}" "$@"
        ;;
    *)
        exec forge "$@"
        ;;
esac
