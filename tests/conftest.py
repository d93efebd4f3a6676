"""Shared fixtures: tiny local models, built on the spot (no downloads).

Torch runs on one thread: the suite shares 2 cores with other work, and two spinning intra-op
threads on a busy core make a tiny forward pass ~50x slower than one thread.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

torch.set_num_threads(1)
hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()

REQUIRE_SANDBOX = "FEEDBACKRL_REQUIRE_SANDBOX"


def sandbox_gaps(*needs: str) -> list[str]:
    """What the code sandbox lacks here: isolation mechanisms, and "cgroup" / "seccomp" if in `needs`."""
    from feedbackrl.rewards import sandbox

    gaps = [f"{name} unavailable" for name, ok in sandbox.probe().items() if not ok]
    if "cgroup" in needs and not sandbox.cgroup_available():
        gaps.append("no job cgroup (memory and pids controllers), so in-memory files and shared memory go uncounted")
    if "seccomp" in needs and sandbox.sandbox_seccomp.bpf()[0] is None:
        gaps.append(f"no seccomp filter ({sandbox.sandbox_seccomp.bpf()[1]})")
    return gaps


def check_sandbox(*needs: str) -> None:
    """Skip the test where the sandbox cannot run, or fail it under FEEDBACKRL_REQUIRE_SANDBOX=1 (CI)."""
    gaps = sandbox_gaps(*needs)
    if not gaps:
        return
    why = f"code sandbox unavailable here: {'; '.join(gaps)}"
    if os.environ.get(REQUIRE_SANDBOX) == "1":
        pytest.fail(f"{why} ({REQUIRE_SANDBOX}=1 makes this a failure, not a skip)", pytrace=False)
    pytest.skip(why)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked `sandbox` (optionally `sandbox("cgroup")`, `sandbox("seccomp")`) need the code sandbox."""
    marker = item.get_closest_marker("sandbox")
    if marker is not None:
        check_sandbox(*marker.args)


@pytest.fixture(scope="session")
def sandbox_required() -> None:
    """For fixtures that build a sandboxed verifier: the same skip-or-fail as the `sandbox` marker."""
    check_sandbox()


@pytest.fixture(autouse=True)
def _one_thread():
    """Runs set their own thread count (`train.threads`); put it back so no test leaks it to the next.

    Float sums over 2 threads round differently, and tests that compare sampled tokens bit for bit
    would then depend on which tests ran before them.
    """
    yield
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly initialised tiny Llama + char tokenizer saved with save_pretrained (seed 0). Read-only."""
    from feedbackrl.models.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny") / "model", size="tiny", seed=0)


@pytest.fixture(scope="session")
def tokenizer():
    from feedbackrl.models.tiny import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def peaked_lm(tokenizer):
    """A tiny Llama whose 2-D weights are redrawn with std 0.3 (instead of 0.02). Read-only.

    The stock init gives near-uniform logits and the same argmax for every prompt, which makes
    greedy comparisons vacuous; larger weights make the output depend on the prompt and leave
    clear gaps between the top logits.
    """
    from feedbackrl.models.tiny import build_model

    model = build_model(tokenizer, "tiny", seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3, generator=gen)
    return model.eval()


def build_peaked_qwen(tokenizer, hidden_size: int = 64):
    """A tiny Qwen2 with grouped-query attention (4 query heads, 2 KV heads) and q/k/v biases, its matrices and
    biases drawn at std 0.3 so greedy outputs depend on the prompt; heads hidden_size / 4 wide."""
    cfg = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=2 * hidden_size, max_position_embeddings=128,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 or name.endswith(".bias"):
                p.normal_(0.0, 0.3, generator=gen)
    return model.eval()


@pytest.fixture(scope="session")
def peaked_qwen(tokenizer):
    return build_peaked_qwen(tokenizer)


@pytest.fixture(scope="session")
def peaked_qwen_32(tokenizer):
    """`peaked_qwen` with 32-dim heads instead of 16: vLLM's CPU attention kernels take head sizes 32, 64, 80, ...
    only (a 16-dim head fails at the first forward)."""
    return build_peaked_qwen(tokenizer, hidden_size=128)


@pytest.fixture(scope="session")
def reward_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reward model on the tiny Llama with a random (not zero) head, saved as a reward_model run writes it."""
    import torch

    from feedbackrl.models.load import load_policy, load_tokenizer
    from feedbackrl.models.reward import build_reward_model, save_reward_model

    torch.manual_seed(0)
    rm = build_reward_model(load_policy(str(tiny_model_dir)))
    with torch.no_grad():  # the per-token head starts at 0 (every response scores the same): give it weights
        rm.head.weight.normal_(0, 0.02)
    return save_reward_model(rm, load_tokenizer(str(tiny_model_dir)), tmp_path_factory.mktemp("rm") / "rm")


# --- a small model with SmolLM2-135M-Instruct's architecture features ----------------------------------------------

SMOL_TEMPLATE = (  # SmolLM2-135M-Instruct's chat template, verbatim
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SMOL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2


def build_smol_tokenizer():
    """A byte-level BPE tokenizer trained here on a few sentences, with SmolLM2's special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["What is 12 + 7? The answer is 19.", "system user assistant", "Compute 83 - 35. So, 83 - 35 = 48.",
              "You are a helpful AI assistant named SmolLM, trained by Hugging Face"] * 20
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SMOL_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|im_end|>", unk_token="<|endoftext|>")
    fast.chat_template = SMOL_TEMPLATE
    fast.padding_side = "left"
    return fast


@pytest.fixture(scope="session")
def smol_tokenizer():
    return build_smol_tokenizer()


@pytest.fixture(scope="session")
def smol_lm(smol_tokenizer):
    """A Llama like SmolLM2-135M (GQA 4:2 heads, tied embeddings, rope_theta 1e5, two end tokens) with
    weights drawn at std 0.3 so greedy outputs depend on the prompt. Read-only."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(smol_tokenizer), hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, rms_norm_eps=1e-5,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3, generator=gen)
    model.generation_config.eos_token_id = [0, 2]
    return model.eval()


# --- a tokenizer whose chat template offers tools (Qwen2.5-like syntax) ------------------------------------------

TOOL_TEMPLATE = (  # written for the tests in the style of Qwen2.5's tool-calling template (ChatML + Hermes tags)
    "{%- if tools %}{{- '<|im_start|>system\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}"
    "{{- '# Tools\nCall a function by writing its name and arguments as JSON inside <tool_call></tool_call>:\n"
    "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>\nFunctions:\n<tools>' }}"
    "{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}{{- '\n</tools><|im_end|>\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}"
    "{%- elif message.role == 'assistant' and not message.tool_calls %}"
    "{{- '<|im_start|>assistant\n' + message.content + '<|im_end|>\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls %}{{- '\n<tool_call>\n{\"name\": \"' + call.function.name"
    " + '\", \"arguments\": ' + (call.function.arguments | tojson) + '}\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")


def build_tool_chat_tokenizer():
    """SmolLM2-like byte-level BPE (trained here) with `TOOL_TEMPLATE`, and <tool_call> tags as added tokens."""
    tok = build_smol_tokenizer()
    tok.add_tokens(["<tool_call>", "</tool_call>"])
    tok.chat_template = TOOL_TEMPLATE
    tok.name_or_path = "local/tool-chat"
    return tok


@pytest.fixture(scope="session")
def tool_chat_tokenizer():
    return build_tool_chat_tokenizer()
