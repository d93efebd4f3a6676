"""Generation on a CUDA GPU: our `generate` against HF `model.generate`, alternating call by call.

    python benchmarks/gpu_generate.py --out benchmarks/results/gpu_generate.json

The benchmark's generation row (batch 64, 12-token prompts, 128 new tokens, temperature 1, EOS
suppressed) on the tiny and small random Llamas, fp32, on the first GPU. Not part of `run.py` (CI and
this project's machines have no GPU); run it where one is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from feedbackrl.models.logprobs import encode_prompts
from feedbackrl.models.tiny import build_model, build_tokenizer
from feedbackrl.rollout.generate import generate

PROMPTS = ["".join(chr(97 + (i * 7 + j * 3) % 26) for j in range(12)) for i in range(64)]
NEW = 128


def timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/gpu_generate.json")
    args = ap.parse_args()
    tok, rows = build_tokenizer(), []
    for size in args.sizes:
        model = build_model(tok, size).cuda().eval()
        ids, mask = (t.cuda() for t in encode_prompts(tok, PROMPTS))

        def ours(model=model):
            generate(model, tok, PROMPTS, NEW, generator=torch.Generator().manual_seed(0), min_new_tokens=NEW)

        def hf(model=model, ids=ids, mask=mask):
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, top_p=1.0,
                               temperature=1.0, max_new_tokens=NEW, min_new_tokens=NEW,
                               pad_token_id=tok.pad_token_id)

        ours(), hf()  # warm-up
        times: dict[str, list[float]] = {"ours": [], "hf": []}
        for _ in range(args.repeats):
            times["ours"].append(timed(ours))
            times["hf"].append(timed(hf))
        tok_s = {k: len(PROMPTS) * NEW / statistics.median(v) for k, v in times.items()}
        rows.append({"size": size, "device": torch.cuda.get_device_name(), "ours_tok_s": round(tok_s["ours"]),
                     "hf_tok_s": round(tok_s["hf"]), "ratio": round(tok_s["ours"] / tok_s["hf"], 2),
                     "torch": torch.__version__})
        print(json.dumps(rows[-1]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
