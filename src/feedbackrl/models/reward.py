"""Reward and cost models: a causal LM backbone with a scalar head read at the last real token.

The text scored is prompt + response + EOS, tokenized as one left-padded sequence, so the last
real token of every row sits in the last column (and EOS marks that the response ended). The
head reads the backbone's final hidden state there (`backbone.base_model`, so the LM head is
never run), as in Stiennon et al. 2020 and Ouyang et al. 2022.

On disk (`save_reward_model`) a reward model is an ordinary Hugging Face model directory (the
backbone with `save_pretrained`, reloadable with `AutoModelForCausalLM`, and its tokenizer) plus
two small files: `reward_head.safetensors` (the head's weight and bias) and `reward_model.json`
(the marker: kind, calibration, format version). `load_reward_model` reloads it exactly.

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
from feedbackrl.rollout.generate import positions

MARKER = "reward_model.json"
HEAD_FILE = "reward_head.safetensors"
FORMAT_VERSION = 1


@dataclass
class Calibration:
    center: float = 0.0
    scale: float = 1.0


class RewardModel(nn.Module):
    """backbone: any HF causal LM; `forward` returns (N,) raw scores."""

    def __init__(self, backbone: PreTrainedModel, kind: str = "reward", calibration: Calibration | None = None) -> None:
        super().__init__()
        if kind not in ("reward", "cost"):
            raise ValueError(f"kind must be 'reward' or 'cost', got {kind!r}")
        self.backbone = backbone
        self.head = nn.Linear(backbone.config.hidden_size, 1)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)
        self.kind = kind
        self.calibration = calibration or Calibration()

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """input_ids, attention_mask: (N, L), left-padded -> (N,) raw scores at the last column."""
        out = self.backbone.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                       position_ids=positions(attention_mask))
        return self.head(out.last_hidden_state[:, -1]).squeeze(-1).float()

    def calibrate(self, raw: Tensor) -> Tensor:
        c = self.calibration
        return torch.sigmoid((raw - c.center) / c.scale)


def build_reward_model(policy: PreTrainedModel, kind: str = "reward") -> RewardModel:
    """A reward model whose backbone is a copy of `policy` (InstructGPT starts it from the SFT model)."""
    return RewardModel(copy.deepcopy(policy), kind)


def encode_texts(tokenizer: PreTrainedTokenizerBase, prompts: list[str], responses: list[str]) -> tuple[Tensor, Tensor]:
    """prompt + response + EOS per row, left-padded -> (ids, mask), both (N, L)."""
    rows = [tokenizer(p + r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            for p, r in zip(prompts, responses, strict=True)]
    width = max(len(x) for x in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, x in enumerate(rows):
        ids[i, width - len(x) :] = torch.tensor(x)
        mask[i, width - len(x) :] = 1
    return ids, mask


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


def save_reward_model(model: RewardModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.backbone.save_pretrained(path)
    tokenizer.save_pretrained(path)
    save_file({"weight": model.head.weight.detach().contiguous(), "bias": model.head.bias.detach().contiguous()},
              path / HEAD_FILE)
    marker = {"format": "feedbackrl.reward_model", "version": FORMAT_VERSION, "kind": model.kind,
              "head": HEAD_FILE, "calibration": {"center": model.calibration.center,
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
    model = RewardModel(load_policy(str(path)), marker["kind"], Calibration(**marker["calibration"]))
    head = load_file(path / marker["head"])
    with torch.no_grad():
        model.head.weight.copy_(head["weight"])
        model.head.bias.copy_(head["bias"])
    return model.eval(), load_tokenizer(str(path))
