"""Serve a policy (a model directory or checkpoint) as an OpenAI-compatible endpoint on loopback.

Environments that reach a model over HTTP (the `openai` client, `verifiers`) talk to it at
``http://127.0.0.1:PORT/v1`` (chat completions, streaming included) and at the server root
(``POST /inference/v1/generate``, token ids in, token ids and log-probs out). Needs the
`feedback` extra (FastAPI, uvicorn).

    python examples/serve_policy.py runs/calc_tool/checkpoints/step_000040 --port 8765
    python examples/serve_policy.py tiny --port 8765     # a freshly built tiny model

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

import argparse
import tempfile

import uvicorn

from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.models.tiny import make_tiny
from feedbackrl.serve.openai_api import create_app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="model dir, checkpoint dir, or 'tiny' for a freshly built tiny model")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--name", default="policy", help="the model name clients send")
    args = ap.parse_args()
    path = str(make_tiny(tempfile.mkdtemp(prefix="tiny-"))) if args.model == "tiny" else args.model
    app = create_app(load_policy(path), load_tokenizer(path), args.name)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
