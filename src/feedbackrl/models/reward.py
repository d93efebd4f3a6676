"""Reward and cost models: a causal LM backbone with a scalar score from one of two heads.

The text scored is prompt + response + EOS, tokenized as one left-padded sequence, so the last
real token of every row sits in the last column (and EOS marks that the response ended). Both
heads read the backbone's final hidden states (`backbone.base_model`; the LM head is never run):

- `last_token`: a linear head (H -> 1) on the hidden state at the last token, as in Stiennon et al.
  2020 and Ouyang et al. 2022.
- `per_token` (the default): a score for every response token x_t (EOS included), read from the
  hidden state *before* it with a V x H matrix shaped like an LM head, summed over the response:
  r = sum_t (W[x_t] . h_{t-1} + b[x_t]). That is the shape of DPO's implicit reward
  (beta * sum_t log pi(x_t | x_<t) / pi_ref, Rafailov et al. 2023) with a free head instead of
  log-prob ratios. Why: h_{t-1} is where the backbone has already worked out which token should
  come next, so whether x_t is the right one is one linear read-out away; a single score at the
  last token has to gather every such comparison through attention first. On word reversal, with
  the same 16k pairs and one epoch, the per-token head reaches 0.85 held-out pairwise accuracy
  (ceiling 0.88), the last-token head 0.59-0.71 (docs/preferences.md). Zero-initialised, so an
  untrained model scores every response 0. The head is V x H: for a large vocabulary only the
  rows of the tokens present are gathered, never a (N, L, V) tensor.

On disk (`save_reward_model`) a reward model is an ordinary Hugging Face model directory (the
backbone with `save_pretrained`, reloadable with `AutoModelForCausalLM`, and its tokenizer) plus
two small files: `reward_head.safetensors` (the head's weight and bias) and `reward_model.json`
(the marker: kind, head, calibration, format version; a marker without `head_type` predates the
per-token head and means `last_token`). `load_reward_model` reloads it exactly.

Calibration: raw scores are unbounded and only their differences mean anything under
Bradley-Terry, so the mean and standard deviation of the raw scores over the training responses
are stored with the model; `calibrate` maps raw r to sigmoid((r - center) / scale) in (0, 1),
0.5 for a typical training response. A cost model (kind = "cost") is the same machinery trained
on pairs whose `chosen` column holds the costlier response (as in Safe RLHF, Dai et al. 2023), so
a higher score means more cost; `kind` is stored so a reward source knows which way is good.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from feedbackrl.models.load import ModelLoadError, load_policy, load_tokenizer
from feedbackrl.models.logprobs import positions

MARKER = "reward_model.json"
HEAD_FILE = "reward_head.safetensors"
FORMAT_VERSION = 1
HEAD_TYPES = ("per_token", "last_token")


@dataclass
class Calibration:
    center: float = 0.0
    scale: float = 1.0


class RewardModel(nn.Module):
    """backbone: any HF causal LM; `forward` returns (N,) raw scores. head_type: see the module docstring."""

    def __init__(self, backbone: PreTrainedModel, kind: str = "reward", calibration: Calibration | None = None,
                 head_type: str = "per_token") -> None:
        super().__init__()
        if kind not in ("reward", "cost"):
            raise ValueError(f"kind must be 'reward' or 'cost', got {kind!r}")
        if head_type not in HEAD_TYPES:
            raise ValueError(f"head_type must be one of {HEAD_TYPES}, got {head_type!r}")
        self.backbone = backbone
        if head_type == "per_token":
            self.head = nn.Linear(backbone.config.hidden_size, backbone.config.vocab_size)
            nn.init.zeros_(self.head.weight)
        else:
            self.head = nn.Linear(backbone.config.hidden_size, 1)
            nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)
        self.kind, self.head_type = kind, head_type
        self.calibration = calibration or Calibration()

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """(N, L, H) final hidden states of the backbone (the LM head is never run)."""
        return self.backbone.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                        position_ids=positions(attention_mask)).last_hidden_state

    def forward(self, input_ids: Tensor, attention_mask: Tensor, response_mask: Tensor) -> Tensor:
        """input_ids, attention_mask, response_mask: (N, L), left-padded, response_mask = 1 on the
        response and its EOS (as `encode_texts` returns them) -> (N,) raw scores."""
        hidden = self.hidden_states(input_ids, attention_mask)  # (N, L, H)
        if self.head_type == "last_token":
            return self.head(hidden[:, -1]).squeeze(-1).float()
        nxt = input_ids[:, 1:]  # token t is scored from the hidden state at t - 1
        scores = (hidden[:, :-1] * self.head.weight[nxt]).sum(-1) + self.head.bias[nxt]  # (N, L-1)
        return (scores * response_mask[:, 1:]).sum(-1).float()

    def calibrate(self, raw: Tensor) -> Tensor:
        c = self.calibration
        return torch.sigmoid((raw - c.center) / c.scale)


def build_reward_model(policy: PreTrainedModel, kind: str = "reward", head_type: str = "per_token") -> RewardModel:
    """A reward model whose backbone is a copy of `policy` (InstructGPT starts it from the SFT model)."""
    return RewardModel(copy.deepcopy(policy), kind, head_type=head_type)


def encode_texts(tokenizer: PreTrainedTokenizerBase, prompts: list[str],
                 responses: list[str]) -> tuple[Tensor, Tensor, Tensor]:
    """prompt + response + EOS per row, left-padded -> (ids, mask, response_mask), all (N, L).

    The prompt and response are tokenized separately, so response_mask marks exactly the
    response's tokens and the EOS."""
    rows = [(tokenizer(p, add_special_tokens=False)["input_ids"],
             tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
            for p, r in zip(prompts, responses, strict=True)]
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    response_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        ids[i, width - len(p) - len(r) :] = torch.tensor(p + r)
        mask[i, width - len(p) - len(r) :] = 1
        response_mask[i, width - len(r) :] = 1
    return ids, mask, response_mask


@torch.no_grad()
def score_texts(model: RewardModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str], responses: list[str],
                batch_size: int = 256) -> Tensor:
    """(N,) raw scores, in eval mode, batch by batch."""
    was_training = model.training
    model.eval()
    out = [model(*encode_texts(tokenizer, prompts[i : i + batch_size], responses[i : i + batch_size]))
           for i in range(0, len(prompts), batch_size)]
    model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0)


@torch.no_grad()
def head_features(model: RewardModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str], responses: list[str],
                  batch_size: int = 256) -> Tensor:
    """(N, D) features phi of each text such that raw score = phi . theta, theta = [W | b] the head's
    weights flattened row by row (D = V x (H + 1) for the per-token head, H + 1 for the last-token head).

    The score is linear in the head, so these are what a Bayesian treatment of the head (a Laplace
    approximation of its posterior, `algos/pair_selection.py`) needs: per-token head,
    phi[v] = sum over response tokens x_t = v of [h_{t-1}, 1]; last-token head, [h_last, 1]."""
    was_training = model.training
    model.eval()
    out = []
    for i in range(0, len(prompts), batch_size):
        ids, mask, response_mask = encode_texts(tokenizer, prompts[i : i + batch_size], responses[i : i + batch_size])
        hidden = model.hidden_states(ids, mask).float()  # (n, L, H)
        hidden = torch.cat([hidden, torch.ones_like(hidden[..., :1])], dim=-1)  # (n, L, H + 1)
        if model.head_type == "last_token":
            out.append(hidden[:, -1])
            continue
        n, width = hidden.shape[-1], model.head.weight.shape[0]
        weighted = hidden[:, :-1] * response_mask[:, 1:, None]  # (n, L-1, H+1): token t read from t - 1
        phi = hidden.new_zeros(len(ids), width, n)
        phi.scatter_add_(1, ids[:, 1:, None].expand(-1, -1, n), weighted)
        out.append(phi.flatten(1))
    model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0, 0)


def head_parameters(model: RewardModel) -> Tensor:
    """theta = [W | b] flattened, in the order of `head_features`: raw score = head_features . theta."""
    return torch.cat([model.head.weight, model.head.bias[:, None]], dim=1).detach().flatten().float()


def save_reward_model(model: RewardModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.backbone.save_pretrained(path)
    tokenizer.save_pretrained(path)
    save_file({"weight": model.head.weight.detach().contiguous(), "bias": model.head.bias.detach().contiguous()},
              path / HEAD_FILE)
    marker = {"format": "feedbackrl.reward_model", "version": FORMAT_VERSION, "kind": model.kind,
              "head": HEAD_FILE, "head_type": model.head_type, "calibration": {"center": model.calibration.center,
                                                 "scale": model.calibration.scale}}
    (path / MARKER).write_text(json.dumps(marker, indent=2))
    return path


def load_reward_model(path: str | Path) -> tuple[RewardModel, PreTrainedTokenizerBase]:
    """Reload a directory written by `save_reward_model` (in eval mode)."""
    path = Path(path)
    if not (path / MARKER).is_file():
        raise ModelLoadError(f"{str(path)!r} is not a reward model directory (no {MARKER}); train one with "
                             "`feedbackrl train recipes/reward_model.toml --out DIR` and use DIR/reward_model")
    marker = json.loads((path / MARKER).read_text())
    if marker.get("version") != FORMAT_VERSION:
        raise ModelLoadError(f"{path / MARKER}: format version {marker.get('version')!r}, expected {FORMAT_VERSION}")
    model = RewardModel(load_policy(str(path)), marker["kind"], Calibration(**marker["calibration"]),
                        marker.get("head_type", "last_token"))
    head = load_file(path / marker["head"])
    with torch.no_grad():
        model.head.weight.copy_(head["weight"])
        model.head.bias.copy_(head["bias"])
    return model.eval(), load_tokenizer(str(path))
