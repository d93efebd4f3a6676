"""`scale.ray_address = "auto"`: a run joins the Ray cluster that `ray start` already runs.

The cluster is this test's own: `ray start --head --block` in a new session, with its own temp dir (so
no other process on the machine sees its address file: a plain `ray.init()` elsewhere would try to join
it), its own authentication token and a marker resource that a cluster the driver started itself would
not have. The driver (`ray_auto_driver.py`, a process of its own, as a user's would be) finds it the
first way Ray's "auto" looks, RAY_ADDRESS. At the end the `ray start` process is stopped by its id;
`ray stop` is not used because it stops every Ray process of the user, other runs' clusters included.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("ray")

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from ray_auto_driver import config, grpo  # noqa: E402
from test_checkpoint_resume import assert_same_parameters  # noqa: E402

DRIVER = Path(__file__).with_name("ray_auto_driver.py")
MARKER = "feedbackrl_test_head"  # a custom resource only the cluster started here has
START_S = 60  # how long `ray start` may take to bring the head up


def ray_cli() -> str | None:
    """The `ray` command: on PATH, else beside this interpreter (a virtual environment not activated)."""
    beside = Path(sys.executable).with_name("ray")
    return shutil.which("ray") or (str(beside) if beside.exists() else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_session(head: subprocess.Popen) -> None:
    """Stop the `ray start --block` process (it stops the node's processes as it exits), then anything of its
    session still alive after 10 s."""
    head.send_signal(signal.SIGTERM)
    try:
        head.wait(timeout=30)
    except subprocess.TimeoutExpired:
        head.kill()
        head.wait()
    for _ in range(20):
        try:
            os.killpg(head.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    os.killpg(head.pid, signal.SIGKILL)


@pytest.fixture
def head_node(tmp_path):
    """A 2-CPU Ray head node started by `ray start`; yields (its port, the environment that joins it)."""
    cli = ray_cli()
    if cli is None:
        pytest.skip("the `ray` command is not installed (it comes with `pip install 'ray[default]'`)")
    port, temp_dir = free_port(), tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths live there
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # the workers import feedbackrl; a token of this test's own (Ray turns token auth on for a driver given an
    # address only when told: RAY_AUTH_MODE)
    env.update({"PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN": secrets.token_hex(32)})
    log = tmp_path / "ray_start.log"
    with log.open("w") as out:
        head = subprocess.Popen(
            [cli, "start", "--head", "--block", "--num-cpus", "2", "--port", str(port), "--temp-dir", temp_dir,
             "--resources", f'{{"{MARKER}": 1}}', "--include-dashboard", "false", "--disable-usage-stats"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_S
        while "Ray runtime started" not in log.read_text():
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"`ray start --head` did not come up:\n{log.read_text()}")
            time.sleep(0.5)
        yield port, {**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}
    finally:
        stop_session(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("weight_sync", ["object_store", "collective"])
def test_auto_joins_the_running_cluster(tiny_model_dir, tmp_path, head_node, weight_sync):
    # collective: the process group's store is on the driver, at the address Ray gives its node
    port, env = head_node
    proc = subprocess.run([sys.executable, str(DRIVER), str(tiny_model_dir), str(tmp_path), weight_sync], env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    # joined, not started: connected to the head's port, and the cluster is the head's (its marker, its 2 CPUs)
    assert seen["initialized"]
    assert seen["gcs_address"].rsplit(":", 1)[1] == str(port)
    assert seen["resources"].get(MARKER) == 1.0 and seen["resources"]["CPU"] == 2.0 and seen["nodes"] == 1
    # and the run is the single process's (synchronous workers), two steps of it
    want, want_rows = grpo(tiny_model_dir, tmp_path / "one", config())
    assert_same_parameters(torch.load(tmp_path / "params.pt"), want)
    assert seen["rewards"] == [want_rows[s]["reward/mean"] for s in (1, 2)]
    assert seen["staleness_max"] == [0.0, 0.0]
    assert seen["weights_s"][1] > 0 and seen["process_group_left"]  # weights sent after step 1; group left
    # the cluster outlived the driver: it was not the driver's to stop
    alive = subprocess.run([sys.executable, "-c", "import ray; ray.init(log_to_driver=False); "
                            f"print(ray.cluster_resources().get('{MARKER}'))"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert alive.stdout.strip().splitlines()[-1] == "1.0", alive.stderr[-2000:]
