"""Float32 error bounds for the kernel and decoder parity tests, derived from the unit roundoff.

No tolerance here is fitted to one CPU. Vector width (SSE, AVX2, AVX-512, AMX), summation order, blocking and
FMA contraction differ between CPUs and change the last bits of every sum; what they cannot change is the
rounding error analysis. Each fp32 operation rounds with relative error at most U = 2**-24, and a sum or dot
product of n terms, in any order and with or without FMA, is within gamma(n) * sum(|terms|) of the exact value,
gamma(n) = n U / (1 - n U) (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., 2002, sec. 3.1).

The tests therefore compare every float32 side (the kernel, the PyTorch ops it replaces) against a float64 run
of the same maths, and bound each side's error by such a sum over the float64 run's magnitudes.
"""

from __future__ import annotations

import math

import torch

U = 2.0**-24  # unit roundoff of float32 (half its machine epsilon)


def gamma(n: int) -> float:
    """Worst-case relative error of an n-term float32 sum or dot product, any order, any FMA use."""
    return n * U / (1 - n * U)


def probabilistic_gamma(n: int, lam: float = 8.0) -> float:
    """lam * sqrt(n) * U: the bound an n-term float32 sum or dot product keeps with probability at least
    1 - 2 exp(-lam**2 / 2) (1 - 3e-14 at lam = 8) when rounding errors are independent and mean-zero
    (Higham and Mary, "A new approach to probabilistic rounding error analysis", SIAM J. Sci. Comput. 2019,
    theorem 3.1). For whole-model comparisons, where the worst case gamma(n) over every layer's sums is
    orders of magnitude above any error a CPU makes."""
    return lam * math.sqrt(n) * U


def assert_within(got: torch.Tensor, truth: torch.Tensor, bound: torch.Tensor | float, what: str) -> None:
    """|got - truth| <= bound elementwise, truth float64; the message names the worst element and its bound."""
    err = (got.double() - truth).abs()
    bound = torch.as_tensor(bound, dtype=torch.float64).expand_as(err)
    excess = err - bound
    worst = int(excess.argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), err.shape))
    assert excess.max() <= 0, (f"{what}: error {err.flatten()[worst].item():.3e} at {idx} above its float32 "
                               f"bound {bound.flatten()[worst].item():.3e} (largest error {err.max().item():.3e})")


def reduction_length(config, seq_len: int) -> int:
    """Terms summed along one logit's chain in a Llama-family decoder forward: per layer the two RMSNorms
    (hidden), the q/k/v projections (hidden), the scores and the weighted values (seq_len each), o_proj
    (heads x head_dim), the MLP's gate/up (hidden) and down (intermediate) projections; then the final norm,
    the LM head (hidden) and the log-softmax over the vocabulary."""
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    per_layer = 2 * hidden + hidden + 2 * seq_len + heads * head_dim + hidden + config.intermediate_size
    return config.num_hidden_layers * per_layer + 2 * hidden + config.vocab_size


def decoder_logprob_tolerance(model64: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                              extra_terms: int = 0) -> float:
    """A float32 bound on any token log-prob of `model64`'s float32 original on (ids, mask), from its float64 copy.

    The LM head sums hidden x weight over `hidden` terms; S, the largest such sum in magnitude
    (sum_h |h_h| |W_vh| + |b_v|), scales the error of a logit, into which every earlier sum's error has been
    carried (they are relative errors of the same hidden states). A logit's error is then within
    probabilistic_gamma(n) * S, n the reduction length of its whole chain, and a log-prob (a logit minus a
    logsumexp, 1-Lipschitz in the largest logit error) within twice that. `extra_terms`: terms the float32
    model's chain sums beyond a plain decoder's (LoRA's low-rank path, `adapter_terms`).
    """
    from feedbackrl.models.logprobs import positions

    with torch.no_grad():
        hidden = model64.base_model(input_ids=ids, attention_mask=mask, position_ids=positions(mask),
                                    use_cache=False).last_hidden_state
        head = model64.get_output_embeddings()
        mag = hidden.abs() @ head.weight.abs().T
        if head.bias is not None:
            mag = mag + head.bias.abs()
        real = mask.bool()
    n = reduction_length(model64.config, ids.shape[1]) + extra_terms
    return 2 * probabilistic_gamma(n) * mag[real].max().item()


def float64_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of `model`. A peft LoRA model is merged (in float64) into a plain decoder: W + s B A
    applied to x is the adapter forward W x + s B (A x) to float64 rounding, and both float32 forms, the
    adapters merged into a float32 weight (the fast decoder, an export) or applied per layer (peft), are
    then compared with one float64 truth."""
    import copy

    from feedbackrl.models.lora import is_lora

    model64 = copy.deepcopy(model).double()
    return model64.merge_and_unload() if is_lora(model64) else model64


def adapter_terms(model: torch.nn.Module) -> int:
    """Terms LoRA adds to one logit's chain, which passes every layer: rank + 2 for each adapted projection (the
    rank-term sum B (A x), or B A merged into W; its scaling; its addition to W x). 0 without adapters."""
    from feedbackrl.models.lora import is_lora_linear

    ranks = [m.r[a] for m in model.modules() if is_lora_linear(m) for a in m.active_adapters if a in m.lora_A]
    return sum(ranks) + 2 * len(ranks)


def assert_logits_within_fp32(model: torch.nn.Module, ids: torch.Tensor, sides: dict[str, torch.Tensor]) -> None:
    """Each float32 logits tensor in `sides` (of `ids`, no padding) within float32 rounding of a float64 copy of
    `model`: half `decoder_logprob_tolerance`, the bound on a logit before the log-softmax doubles it."""
    model64 = float64_copy(model)
    with torch.no_grad():
        truth = model64(ids).logits
    tol = decoder_logprob_tolerance(model64, ids, torch.ones_like(ids), adapter_terms(model)) / 2
    assert 0 < tol < 1e-2 * truth.abs().max().item(), tol  # far below the logit gaps a wrong weight or position makes
    for name, got in sides.items():
        assert_within(got, truth, tol, name)


def assert_logprobs_within_fp32(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                                completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                                sides: dict[str, torch.Tensor], temperature: float = 1.0) -> None:
    """Each float32 log-prob tensor in `sides` within `decoder_logprob_tolerance` of a float64 copy of `model`
    scoring the same tokens (exactly 0 on padding). Logits are divided by the temperature, and so are their
    errors: the bound is divided by it too."""
    from feedbackrl.models.logprobs import sequence_logprobs

    model64 = float64_copy(model)
    with torch.no_grad():
        truth, _ = sequence_logprobs(model64, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                     temperature=temperature)
    # magnitudes over every position but the prompt's padding: a completion token masked out of the comparison
    # (an environment's turn in an episode) still predicts the next, compared token
    tol = decoder_logprob_tolerance(model64, torch.cat([prompt_ids, completion_ids], 1),
                                    torch.cat([prompt_mask, torch.ones_like(completion_mask)], 1),
                                    adapter_terms(model)) / temperature
    assert 0 < tol < 1e-2, tol  # far below the log-prob gaps a wrong position or temperature makes (order 1)
    for name, got in sides.items():
        assert_within(got, truth, tol * completion_mask, name)
