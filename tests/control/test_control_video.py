"""`feedbackrl eval RUN_DIR --video`: the closed-loop metrics of a control checkpoint and a clip of one greedy
held-out episode, as a GIF (what the labelling app shows) or an H.264 MP4."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from feedbackrl.cli import app
from feedbackrl.config import build_config
from feedbackrl.train.run import run

pytest.importorskip("gymnasium", reason="the control extra installs gymnasium")
iio = pytest.importorskip("imageio.v3", reason="the control extra installs imageio")

runner = CliRunner()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cartpole")
    run(build_config({"algo": {"name": "control_ppo", "steps": 2}, "train": {"threads": 1},
                      "control": {"env": "CartPole-v1", "num_envs": 2, "rollout_steps": 64, "eval_episodes": 3}}), out)
    return out


def _eval(*args):
    result = runner.invoke(app, ["eval", *map(str, args)])
    return result, (json.loads(result.stdout[result.stdout.index("{"):]) if result.exit_code == 0 else None)


def test_eval_prints_the_held_out_metrics_and_writes_a_gif(run_dir, tmp_path):
    result, out = _eval(run_dir, "--video", tmp_path / "clip.gif", "--max-steps", 40)
    assert result.exit_code == 0, result.output
    report = json.loads((run_dir / "report.json").read_text())
    # the same greedy held-out episodes (same seeds) as the run's own final evaluation
    assert out["eval/return"] == report["control_eval_after"]["eval/return"]
    v = out["video"]
    assert v["frames"] == v["episode/length"] + 1 and v["episode/length"] <= 40
    frames = iio.imread(tmp_path / "clip.gif")
    meta = iio.immeta(tmp_path / "clip.gif")
    assert frames.shape[1:] == (200, 300, 3) and frames.dtype == np.uint8, frames.shape  # 600 x 400 shrunk
    assert meta["loop"] == 0  # it loops
    # Pillow merges identical consecutive frames into one longer one: the number of distinct frames varies,
    # the first frame is the reset state, and not every frame is blank
    assert 2 <= len(frames) <= v["frames"] and frames.min() < 100


def test_eval_writes_an_h264_mp4(run_dir, tmp_path):
    pytest.importorskip("imageio_ffmpeg", reason="MP4 needs imageio-ffmpeg (the control extra)")
    import imageio.v2 as iio2

    result, out = _eval(run_dir, "--video", tmp_path / "clip.mp4", "--max-steps", 30)
    assert result.exit_code == 0, result.output
    reader = iio2.get_reader(tmp_path / "clip.mp4")
    meta = reader.get_meta_data()
    assert meta["codec"] == "h264" and meta["fps"] == 25.0 and meta["pix_fmt"].startswith("yuv420p"), meta
    assert sum(1 for _ in reader) == out["video"]["frames"]


def test_eval_refuses_what_it_cannot_do(run_dir, tmp_path):
    result, _ = _eval(run_dir, "--video", tmp_path / "clip.avi")
    assert result.exit_code != 0 and ".gif or .mp4" in result.output
    result, _ = _eval(run_dir, "--set", "train.seed=3")
    assert result.exit_code == 2 and "drop --recipe and --set" in result.output
    (tmp_path / "lm").mkdir()
    result, _ = _eval(tmp_path / "lm", "--video", tmp_path / "clip.gif")
    assert result.exit_code == 2 and "not a control run" in result.output
