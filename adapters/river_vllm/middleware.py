"""What `river serve` adds to vLLM's server (its `--middleware` hook): a request that carries
River settings (`"river": {...}` in its body, the openai client's `extra_body`) is refused
with a 400 that says why, never served with the settings silently dropped. River's settings
are the server's (`river serve --policy ... -o ...`): vLLM's model step sees tokens, not
requests, so it could not apply one request's settings to that request's tokens."""

from __future__ import annotations

import json

REFUSAL = ("River settings are per server, not per request: vLLM's model step sees tokens, not "
           "requests, so it cannot apply them to one request's tokens. Start a server with "
           "them instead: river serve --policy POLICY -o KEY=VALUE (docs/scaling.md)")


async def refuse_river_settings(request, call_next):
    """vLLM's http middleware: a 400 for a JSON request that carries a `river` entry."""
    if request.method == "POST" and "json" in request.headers.get("content-type", ""):
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            body = None
        if isinstance(body, dict) and "river" in body:
            from fastapi.responses import JSONResponse

            return JSONResponse(status_code=400, content={"error": {
                "message": REFUSAL, "type": "BadRequestError", "param": "river",
                "code": 400}})
    return await call_next(request)
