"""The driver of the `scale.ray_address = "auto"` test (tests/scale/test_ray_cluster.py), in its own process:
`python tests/scale/ray_auto_driver.py MODEL_DIR OUT_DIR WEIGHT_SYNC`, with the cluster's address in RAY_ADDRESS.

Trains 2 GRPO steps with `scale.ray_address = "auto"`, 2 rollout workers and `scale.weight_sync =
WEIGHT_SYNC`, saves the parameters to
OUT_DIR/params.pt and prints, as its last line, JSON of what it sees of the cluster it joined.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ray
import torch

from feedbackrl.config import RunConfig, build_config
from feedbackrl.log import MemorySink
from feedbackrl.models.load import load_policy, load_tokenizer
from feedbackrl.train.grpo import train_grpo

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from test_checkpoint_resume import ShapedAddition  # noqa: E402


def config(**scale) -> RunConfig:
    return build_config({"rollout": {"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 4},
                         "algo": {"steps": 2, "lr": 1e-2}, "train": {"seed": 3}, "scale": scale})


def grpo(model_dir: Path, out: Path, cfg: RunConfig) -> tuple[dict, dict]:
    model, tok, rows = load_policy(str(model_dir)), load_tokenizer(str(model_dir)), MemorySink()
    train_grpo(cfg, model, tok, ShapedAddition(), out, rows)  # the collector the [scale] section asks for
    return {k: v.clone() for k, v in model.state_dict().items()}, rows.by_step


def main() -> None:
    model_dir, out, weight_sync = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    assert not ray.is_initialized()
    params, rows = grpo(model_dir, out / "run", config(ray_address="auto", rollout_workers=2, weight_sync=weight_sync))
    torch.save(params, out / "params.pt")
    seen = {"initialized": ray.is_initialized(), "gcs_address": ray.get_runtime_context().gcs_address,
            "resources": ray.cluster_resources(), "nodes": len(ray.nodes()),
            "rewards": [rows[s]["reward/mean"] for s in sorted(rows)],
            "staleness_max": [rows[s]["scale/staleness_max"] for s in sorted(rows)],
            "weights_s": [rows[s].get("perf/weights_broadcast_s", rows[s].get("perf/weights_put_s"))
                          for s in sorted(rows)],
            "process_group_left": not torch.distributed.is_initialized()}
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
