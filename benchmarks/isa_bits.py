"""Which of PyTorch's CPU vector-path settings change float32 results on this machine, op by op.

Runs a few ops (matmul, batched matmul, softmax, exp, sum, SDPA, RMSNorm, SiLU) and a tiny decoder's log-probs
once per setting, each in a fresh process (the variables are read at start-up), and prints how many output
elements differ in any bit from the run without them. `make test-isa` runs the parity tests under the settings
that change something. Usage: `python benchmarks/isa_bits.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

SETTINGS = ["ATEN_CPU_CAPABILITY=default", "ATEN_CPU_CAPABILITY=avx2", "MKL_ENABLE_INSTRUCTIONS=AVX2",
            "MKL_ENABLE_INSTRUCTIONS=SSE4_2", "ONEDNN_MAX_CPU_ISA=AVX2", "ONEDNN_MAX_CPU_ISA=SSE41"]


def outputs(path: str) -> None:
    import torch
    import torch.nn.functional as F

    from feedbackrl.models.logprobs import encode_prompts, sequence_logprobs
    from feedbackrl.models.tiny import build_model, build_tokenizer

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 512, generator=g), torch.randn(512, 384, generator=g)
    x = torch.randn(8, 4, 40, 32, generator=g)
    out = {"matmul": a @ b, "batched matmul": x @ x.transpose(-1, -2), "softmax": a.softmax(-1), "exp": a.exp(),
           "sum": a.sum(-1), "sdpa": F.scaled_dot_product_attention(x, x, x),
           "rmsnorm": a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6), "silu": F.silu(a)}
    tok = build_tokenizer()
    model = build_model(tok, "tiny", seed=0).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3, generator=g)
        p_ids, p_mask = encode_prompts(tok, ["12+3=", "7+85="])
        c_ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
        out["decoder log-probs"] = sequence_logprobs(model, p_ids, p_mask, c_ids, torch.ones_like(c_ids))[0]
    out["capability"] = torch.backends.cpu.get_cpu_capability()
    torch.save(out, path)


def main() -> None:
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for setting in ["(none)", *SETTINGS]:
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            if setting != "(none)":
                key, value = setting.split("=")
                env[key] = value
            path = str(Path(tmp) / f"{len(runs)}.pt")
            subprocess.run([sys.executable, __file__, "--outputs", path], env=env, check=True)
            runs[setting] = torch.load(path)
        base = runs.pop("(none)")
        print(f"ATen capability without settings: {base.pop('capability')}")
        for setting, out in runs.items():
            cap = out.pop("capability")
            diffs = {k: f"{int((out[k] != base[k]).sum())}/{base[k].numel()}" for k in base
                     if not torch.equal(out[k], base[k])}
            print(f"{setting:34} ATen {cap:8} " + (", ".join(f"{k} {v}" for k, v in diffs.items()) or "bit-identical"))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--outputs"]:
        outputs(sys.argv[2])
    else:
        main()
