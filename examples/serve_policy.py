"""Serve a policy (a model directory or checkpoint) as an OpenAI-compatible endpoint on loopback: the same as
`feedbackrl serve MODEL [--port] [--name] [--host]`, which this script calls.

Environments that reach a model over HTTP (the `openai` client, `verifiers`) talk to it at
``http://127.0.0.1:PORT/v1`` (chat completions, streaming included) and at the server root
(``POST /inference/v1/generate``, token ids in, token ids and log-probs out). Needs the
`feedback` extra (FastAPI, uvicorn).

    feedbackrl serve runs/calc_tool/checkpoints/step_000040 --port 8765
    feedbackrl serve tiny --port 8765     # a freshly built tiny model

From a `verifiers` 0.4 virtualenv, its training client's call reads our answer like vLLM's::

    from renderers import create_renderer, DefaultRendererConfig
    from renderers.base import load_tokenizer
    from renderers.client import generate
    tok = load_tokenizer(MODEL_DIR)
    out = await generate(client=AsyncOpenAI(base_url="http://127.0.0.1:8765/v1", api_key="local"),
                         renderer=create_renderer(tok, DefaultRendererConfig()), messages=[], model="policy",
                         prompt_ids=tok("12+30=", add_special_tokens=False)["input_ids"],
                         sampling_params={"max_tokens": 10})
    # out["completion_ids"], out["completion_logprobs"] (one finite value each), out["finish_reason"]
"""

from __future__ import annotations

import sys

from feedbackrl.cli import app

if __name__ == "__main__":
    app(["serve", *sys.argv[1:]])
