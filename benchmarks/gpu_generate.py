"""Generation on a CUDA GPU: our `generate` against HF `model.generate` (and vLLM), alternating call by call.

    python benchmarks/gpu_generate.py --out benchmarks/results/gpu_generate.json
    python benchmarks/gpu_generate.py --vllm --out benchmarks/results/gpu_generate_vllm.json
    python benchmarks/gpu_generate.py --vllm --device cpu --sizes tiny     (vLLM's CPU build: `make vllm-venv`)

The benchmark's generation row (batch 64, 12-token prompts, 128 new tokens, temperature 1, EOS
suppressed) on the tiny and small random Llamas, fp32, on the first GPU. With `--vllm`, also the engine
`rollout.backend = "vllm"` trains with (`scale/vllm_rollout.py`: in-process vLLM, float32, one seed per row,
the sampled tokens' log-probs), timed from token ids in to our Rollout out, as the collect step uses it;
its start-up (torch.compile, CUDA graph capture) is reported apart (`vllm_start_s`). Not part of `run.py`
(CI and this project's machines have no GPU); run it where one is (`benchmarks/gpu_vllm.sh`).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from common import provenance

from feedbackrl.config import RolloutConfig
from feedbackrl.models.chat import end_token_ids
from feedbackrl.models.logprobs import encode_prompts
from feedbackrl.models.tiny import build_model, build_tokenizer
from feedbackrl.rollout.generate import generate

PROMPTS = ["".join(chr(97 + (i * 7 + j * 3) % 26) for j in range(12)) for i in range(64)]
NEW = 128


def timed(fn) -> float:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def vllm_call(model, tok, ids, mask):
    """The vLLM rollout engine on `model` and a call that samples the row's batch into a Rollout."""
    import vllm

    from feedbackrl.scale.vllm_rollout import VllmEngine, prompt_token_lists, rollout_from_outputs

    cfg = RolloutConfig(max_new_tokens=NEW, min_new_tokens=NEW, temperature=1.0)
    t0 = time.perf_counter()
    # the CPU build sizes its KV cache from the machine's memory unless told: 1 GiB holds this batch many times over
    engine = VllmEngine(model, tok, cfg, seed=0, **({"kv_cache_memory_bytes": 2**30} if model.device.type == "cpu"
                                                   else {}))
    start_s = time.perf_counter() - t0
    load_s = statistics.median(timed(lambda: engine.load(model)) for _ in range(3))  # the push after each update
    prompts, eos = prompt_token_lists(ids, mask), end_token_ids(model, tok)
    draws = torch.Generator().manual_seed(0)

    def call():
        seeds = torch.randint(0, 2**62, (len(PROMPTS),), generator=draws).tolist()
        ro = rollout_from_outputs(engine.generate(prompts, seeds), tok, ids, mask, eos)
        assert int(ro.completion_mask.sum()) == len(PROMPTS) * NEW  # every row NEW tokens, as ours

    return call, engine, {"vllm": vllm.__version__, "vllm_start_s": round(start_s, 1),
                          "vllm_load_weights_ms": round(1000 * load_s, 2)}


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/gpu_generate.json")
    ap.add_argument("--vllm", action="store_true", help="also time the vLLM rollout engine (the vllm extra)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu (with vLLM's CPU build for --vllm)")
    args = ap.parse_args()
    tok, rows = build_tokenizer(), []
    for size in args.sizes:
        model = build_model(tok, size).to(args.device).eval()
        ids, mask = (t.to(args.device) for t in encode_prompts(tok, PROMPTS))

        def ours(model=model):
            generate(model, tok, PROMPTS, NEW, generator=torch.Generator().manual_seed(0), min_new_tokens=NEW)

        def hf(model=model, ids=ids, mask=mask):
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, top_p=1.0,
                               temperature=1.0, max_new_tokens=NEW, min_new_tokens=NEW,
                               pad_token_id=tok.pad_token_id)

        calls = {"ours": ours, "hf": hf}
        extra = {}
        if args.vllm:
            calls["vllm"], engine, extra = vllm_call(model, tok, ids, mask)
        for fn in calls.values():  # warm-up
            fn()
        times: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(args.repeats):
            for k, fn in calls.items():
                times[k].append(timed(fn))
        tok_s = {k: len(PROMPTS) * NEW / statistics.median(v) for k, v in times.items()}
        row = {"size": size, "device": device_name(args.device), "ours_tok_s": round(tok_s["ours"]),
               "hf_tok_s": round(tok_s["hf"]), "ratio": round(tok_s["ours"] / tok_s["hf"], 2),
               "torch": torch.__version__}
        if args.vllm:
            row.update(vllm_tok_s=round(tok_s["vllm"]), vllm_over_ours=round(tok_s["vllm"] / tok_s["ours"], 2),
                       **extra)
            engine.close()
        rows.append(row)
        print(json.dumps(rows[-1]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"provenance": provenance(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
