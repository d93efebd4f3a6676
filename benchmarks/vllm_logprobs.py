"""How far vLLM's sampled-token log-probs are from the learner's, per rollout setting and per vLLM `logprobs_mode`.

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/vllm_logprobs.py --out benchmarks/results/vllm_logprobs.json

For each row of the table in `scale/vllm_rollout.logprobs_mode` (temperature, top_p, min_new_tokens) an engine
is started with each of vLLM's two log-prob modes in turn, samples 20 prompts (the tiny "peaked" Llama of the
tests, float32), and its reported log-probs are compared with `sequence_logprobs` at the sampling temperature
on the same tokens: max |difference| over the sampled tokens. The mode the backend picks should be the one
at float rounding (~1e-5); the other, and both where the backend picks none (the learner recomputes them
there), should be far off. Also: one weight push (every weight moved), its time, and the gap afterwards to the
new and to the old weights. Runs on the device of the installed vLLM build (a CPU build: on the CPU).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
from common import provenance

from feedbackrl.config import RolloutConfig
from feedbackrl.models.chat import end_token_ids
from feedbackrl.models.logprobs import encode_prompts, sequence_logprobs
from feedbackrl.models.tiny import build_model, build_tokenizer
from feedbackrl.scale import vllm_rollout
from feedbackrl.scale.vllm_rollout import VllmEngine, is_cpu_build, prompt_token_lists, rollout_from_outputs

PROMPTS = ["12+3=", "7+85=", "1+1=", "99+99=", "Hello, world!"] * 4
SETTINGS = [(1.0, 1.0, 0), (1.0, 0.9, 4), (0.7, 1.0, 0), (0.7, 0.9, 0), (0.7, 1.0, 2)]


def peaked(tok):
    """The tests' `peaked_lm`: 2-D weights redrawn with std 0.3, so the output depends on the prompt."""
    model = build_model(tok, "tiny", seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3, generator=gen)
    return model.eval()


def gap(engine, model, tok, device, temperature):
    """max |vLLM log-prob - learner log-prob| over the sampled tokens, and how many tokens."""
    ids, mask = (t.to(device) for t in encode_prompts(tok, PROMPTS))
    outs = engine.generate(prompt_token_lists(ids, mask), list(range(len(PROMPTS))))
    ro = rollout_from_outputs(outs, tok, ids, mask, end_token_ids(model, tok))
    with torch.no_grad():
        want = sequence_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                 temperature)[0]
    keep = ro.completion_mask.bool()
    return float((ro.logprobs - want)[keep].abs().max()), int(keep.sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/vllm_logprobs.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    device = "cpu" if is_cpu_build(vllm_rollout.vllm_distributions()) else "cuda"
    extra = {"enforce_eager": True} | ({"kv_cache_memory_bytes": 2**28} if device == "cpu" else {})
    tok = build_tokenizer()
    model = peaked(tok).to(device)
    picked = vllm_rollout.logprobs_mode
    rows = []
    for temperature, top_p, min_new in SETTINGS:
        cfg = RolloutConfig(max_new_tokens=12, temperature=temperature, top_p=top_p, min_new_tokens=min_new)
        row = {"temperature": temperature, "top_p": top_p, "min_new_tokens": min_new,
               "backend_picks": picked(temperature, top_p, min_new)}
        for mode in ("raw_logprobs", "processed_logprobs"):
            vllm_rollout.logprobs_mode = lambda *_, mode=mode: mode  # force this mode on the engine
            try:
                engine = VllmEngine(model, tok, cfg, seed=0, **extra)
            finally:
                vllm_rollout.logprobs_mode = picked
            row[mode], row["tokens"] = gap(engine, model, tok, device, temperature)
            engine.close()
        rows.append(row)
        print(json.dumps(row), flush=True)
    # one weight push: every weight moved; the same prompts again (a stale prefix cache would show)
    engine = VllmEngine(model, tok, RolloutConfig(max_new_tokens=12), seed=0, **extra)
    old = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())).to(device) * 0.05)
    t0 = time.perf_counter()
    engine.load(model)
    push_ms = 1000 * (time.perf_counter() - t0)
    new_gap, _ = gap(engine, model, tok, device, 1.0)
    old_gap, _ = gap(engine, old, tok, device, 1.0)
    engine.close()
    import vllm

    push = {"push_ms": round(push_ms, 1), "gap_to_new_weights": new_gap, "gap_to_old_weights": old_gap,
            "vllm": vllm.__version__, "torch": torch.__version__, "device": device}
    print(json.dumps(push), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result = {"provenance": provenance(), "settings": rows, "weight_push": push}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
