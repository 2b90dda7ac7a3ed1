"""Small helpers shared by the test modules (importable as ``helpers``: pytest puts tests/ on
sys.path for the modules here and in tests/adversarial/)."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np

from tutorial_utils import logs as L

#: the smallest mini-policy training run the tests use (parameters of TrainConfig and the mini family)
TINY_MINI = dict(
    image_size=32,
    model_dim=32,
    num_heads=2,
    action_depth=1,
    language_layers=0,
    num_workers=0,
    scheduler_warmup_steps=2,
    progress=False,
    val_samples=16,
)


#: the tiny MLP the tests train (the ``mlp`` family's parameters: 16-pixel images, 16 hidden units)
TINY_MLP = {"image_size": 16, "pool": 2, "hidden_dim": 16, "task_buckets": 8}
#: a short CPU training of it (TrainConfig parameters; a test adds ``steps``, ``output_dir``...)
TINY_MLP_RUN = {
    "policy": "mlp",
    **TINY_MLP,
    "batch_size": 4,
    "log_freq": 1,
    "eval_freq": 4,
    "save_freq": 4,
    "num_workers": 0,
    "progress": False,
    "scheduler_warmup_steps": 0,
    "val_fraction": 0.2,
    "val_samples": 8,
}


def accelerate_two_processes(script, *args: str) -> tuple[list[str], dict]:
    """``accelerate launch`` of ``script`` on 2 CPU processes (DDP over gloo) on a free port, and
    the environment to run it with (one thread per process)."""
    import socket
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    accelerate = Path(sys.executable).with_name("accelerate")
    cmd = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    cmd += ["--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port)]
    return [*cmd, str(script), *args], {**os.environ, "OMP_NUM_THREADS": "1"}


def wait_for(pred, timeout: float = 60.0, proc=None, interval: float = 0.05) -> bool:
    """Poll ``pred()`` until it is true or ``timeout`` s pass; stop early when ``proc`` exits."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return True
        if proc is not None and proc.poll() is not None:
            return pred()
        time.sleep(interval)
    return False


def openpi_observation(size: int = 224) -> dict:
    """One openpi LIBERO request (seeded): two size x size uint8 images, an 8-D state, a prompt."""
    import numpy as np

    rng = np.random.default_rng(0)
    return {
        "observation/image": rng.integers(0, 255, (size, size, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 255, (size, size, 3), dtype=np.uint8),
        "observation/state": rng.normal(size=8).astype(np.float32),
        "prompt": "pick up the black bowl and place it on the plate",
    }


def needs_lerobot():
    """Skip unless LeRobot 0.4.4 is installed (``make setup`` installs it)."""
    import pytest

    module = pytest.importorskip(
        "lerobot", reason="LeRobot 0.4.4 is not installed: `make setup` installs requirements-lerobot04.txt"
    )
    from tutorial_utils.policies._torchvision import ensure_importable

    ensure_importable()  # LeRobot's modules import torchvision, whose CUDA wheel needs this beside CPU torch
    return module


def fuzz_settings(default_examples: int):
    """hypothesis settings for the bounded CI fuzzers (``TUTORIAL_FUZZ_EXAMPLES`` raises the count
    for a deeper local run); nothing is written into the repository."""
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=int(os.environ.get("TUTORIAL_FUZZ_EXAMPLES", str(default_examples))),
        deadline=None,
        database=None,
        derandomize=True,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )


def fill(disk, leave: int = 0) -> None:
    """Fill ``disk`` so that at most ``leave`` bytes stay free."""
    import contextlib
    import uuid

    filler = disk / f"filler-{uuid.uuid4().hex}"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        with contextlib.suppress(OSError):  # tmpfs refuses the block that does not fit
            while True:
                os.write(fd, b"\0" * 65536)
    finally:
        os.close(fd)
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))


# --- crafted training runs (runs.health, runs.compare, the monitor) ------------------------------

STATS = {
    "franka": {
        "action": {
            "min": [-1.0, -0.8, -1.0, -0.1, -0.1, -0.1, -1.0],
            "max": [1.0, 0.9, 0.5, 0.1, 0.1, 0.1, 1.0],
            "mask": [True] * 6 + [False],
        }
    }
}
CAMERAS = ("observation.images.image", "observation.images.wrist_image")


def decaying(n: int, start: float = 1.0, end: float = 0.1, wiggle: float = 0.05) -> list[float]:
    """A healthy loss: exponential decay with a deterministic wiggle."""
    return [end + (start - end) * math.exp(-4 * i / n) + wiggle * math.sin(7 * i) * end for i in range(n)]


def make_run(
    root: Path,
    name: str = "run",
    *,
    losses: list[float] | None = None,
    lr: float = 1e-3,
    wait: float | list[float] = 0.05,
    seed: int = 1000,
    params: dict | None = None,
    val: dict[int, float] | None = None,
    checkpoints: tuple[int, ...] = (10, 20),
    ckpt_bytes: int = 1000,
    training: dict | None = None,
    stats: dict | None = STATS,
    gripper: str = "dataset",
    cameras: tuple[str, ...] = CAMERAS,
    summary: bool = True,
) -> Path:
    """A training run directory as the loop leaves it, with the values a test needs."""
    d = root / name
    d.mkdir(parents=True)
    losses = decaying(20) if losses is None else losses
    steps = len(losses)
    train = {
        "policy": "mlp",
        "steps": steps,
        "seed": seed,
        "optimizer_lr": lr,
        "scheduler_warmup_steps": 2,
        "save_freq": 10,
        "save_checkpoint": True,
        "keep_last": 0,
        "num_workers": 1,
        "batch_size": 4,
        "output_dir": str(d),
        "run_id": name,
        "dataset": str(d / "dataset"),
        "policy_config": {"hidden_dim": 16},
        **(params or {}),
    }
    (d / "train_config.json").write_text(
        json.dumps({"train": train, "policy_config": train["policy_config"], "dataset": {"name": "demo", "frames": 66}})
    )
    waits = wait if isinstance(wait, list) else [wait] * steps
    rows = [
        {
            "step": i + 1,
            "loss": v,
            "loss_mean": v,
            "lr": lr,
            "grad_norm": 1.0,
            "samples_per_s": 40.0,
            "data_wait_share": waits[i],
            "epoch": 0.1 * i,
            "time": 1.7e9 + i,
        }
        for i, v in enumerate(losses)
    ]
    val = {10: 0.30, 20: 0.25} if val is None else val
    for step, mae in val.items():
        rows.insert(
            [r["step"] for r in rows].index(step) + 1 if step <= steps else len(rows),
            {
                "val_action_mae": mae,
                "val_action_mae_xyz": mae * 1.5,
                "val_gripper_mae": 1.0 - mae,
                "val_frames": 8,
                "step": step,
                "best": True,
                "time": 1.7e9 + step,
                "sample": f"samples/step_{step:06d}.json",
            },
        )
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if stats is not None:
        (d / "dataset_statistics.json").write_text(json.dumps(stats))
    root_ck = d / "checkpoints"
    for step in checkpoints:
        c = root_ck / f"step_{step:06d}"
        c.mkdir(parents=True)
        (c / "training_state.json").write_text(json.dumps({"step": step, "reason": "periodic", "time": 1.7e9 + step}))
        (c / "training_state.pt").write_bytes(b"\0" * (ckpt_bytes // 2))
        (c / "model.safetensors").write_bytes(b"\1" * (ckpt_bytes // 2 - 200))
        (c / "config.json").write_text(json.dumps({"step": step, "dataset": {"name": "demo", "gripper": gripper}}))
        if stats is not None:
            (c / "dataset_statistics.json").write_text(json.dumps(stats))
    if checkpoints:
        (root_ck / "last").symlink_to(f"step_{checkpoints[-1]:06d}")
    meta = d / "dataset" / "meta"
    meta.mkdir(parents=True)
    feats = {k: {"dtype": "video", "shape": [64, 64, 3]} for k in cameras}
    (meta / "info.json").write_text(json.dumps({"codebase_version": "v2.1", "features": feats}))
    modality = {"video": {k.rsplit(".", 1)[1]: {"original_key": k} for k in cameras}}
    (meta / "modality.json").write_text(json.dumps(modality))
    done = {"state": "finished", "step": steps, "total": steps, "wall_s": 12.0, "pid": 1, "host": "elsewhere"}
    (d / "status.json").write_text(json.dumps({"training": training if training is not None else done}))
    if summary and training is None:
        (d / "summary.json").write_text(json.dumps({"steps": steps, "steps_done": steps, "state": "finished"}))
    return d


def results(path: Path, successes: int, episodes: int, gripper: str = "dataset") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "total_episodes": episodes,
                "total_successes": successes,
                "success_rate": successes / episodes,
                "policy": {"gripper": "robosuite", "policy_gripper": gripper},
            }
        )
    )
    return path


# --- log texts as our processes write them (the parsers and the diagnosis) -------------------------

SERVER_OK = f"""\
2026-01-01 10:00:00,000 INFO tutorial_utils.serve: {L.SERVER_RUNNING.format(host="127.0.0.1", port=8000)}
2026-01-01 10:00:00,001 INFO websockets.server: {L.SERVER_LISTENING.format(host="127.0.0.1", port=8000)}
2026-01-01 10:00:01,000 INFO websockets.server: {L.SERVER_CONNECTION_OPEN}
2026-01-01 10:00:01,000 INFO tutorial_utils.serve: {L.SERVER_CONNECTION_FROM.format(addr=("127.0.0.1", 5555))}
2026-01-01 10:05:00,000 INFO tutorial_utils.serve: {L.SERVER_CONNECTION_CLOSED.format(addr=("127.0.0.1", 5555))}
"""

SERVER_NO_CONNECTION = "\n".join(SERVER_OK.splitlines()[:2]) + "\n"


def eval_log(
    tasks=(("pick up the bowl", [True]), ("put the bowl on the plate", [True, False])),
    finish=True,
    prefix="",
    egl=False,
):
    lines, total, ok = [], 0, 0
    for task, results in tasks:
        lines.append(L.EVAL_TASK.format(task=task))
        t_ok = 0
        for r in results:
            total += 1
            ok += r
            t_ok += r
            lines += [
                L.EVAL_STARTING_EPISODE.format(n=total),
                L.EVAL_SUCCESS.format(success=r),
                L.EVAL_EPISODES_SO_FAR.format(n=total),
                L.EVAL_SUCCESSES.format(n=ok, pct=ok / total * 100),
            ]
        lines += [L.EVAL_TASK_RATE.format(rate=t_ok / len(results)), L.EVAL_TOTAL_RATE_SO_FAR.format(rate=ok / total)]
    if finish:
        lines += [L.EVAL_TOTAL_RATE.format(rate=ok / total), L.EVAL_TOTAL_EPISODES.format(n=total)]
    text = "\n".join(prefix + ln for ln in lines) + "\n"
    if egl:
        text += (
            "Exception ignored in: <function MjRenderContext.__del__ at 0x7f>\nTraceback (most recent call last):\n"
            '  File "binding_utils.py", line 199, in __del__\nOpenGL.raw.EGL._errors.EGLError: EGLError(err = EGL_NOT_INITIALIZED)\n'
        )
    return text


TRAIN_OK = (
    "\n".join(
        [
            L.TRAIN_TOTAL_PARAMS.format(n=2_345_678, m=2.345678),
            L.TRAIN_TRAINABLE_PARAMS.format(n=345_678, m=0.345678),
            L.TRAIN_FROZEN_PARAMS.format(n=2_000_000, m=2.0),
            L.TRAIN_RATIO.format(pct=14.74),
            L.TRAIN_TOTAL_STEPS.format(n=2),
            L.TRAIN_DATALOADER_LEN.format(n=52970),
            L.TRAIN_STEP_LOSS.format(
                run_id="smoke", step=1, losses={"action_dit_loss": 1.25, "future_video_loss": 0.5, "total_loss": 1.75}
            ),
            "INFO | "
            + L.TRAIN_STEP_LOSS.format(
                run_id="smoke", step=2, losses="{'action_dit_loss': nan, 'total_loss': tensor(0.9)}"
            ),
            L.TRAIN_COMPLETE.format(path="runs/x/final_model"),
        ]
    )
    + "\n"
)


# --- a recording without LIBERO (sim.record with a stand-in for the expert) -------------------------

RECORD_SIZE = 32


def fake_record_item(cfg, item):
    """A stand-in for the expert: a short random episode per (task, init) item."""
    import numpy as np

    task_id, init = item
    rng = np.random.default_rng(task_id * 100 + init)
    t = 5 + init
    frames = {
        "observation.state": rng.normal(size=(t, 8)).astype(np.float32),
        "action": rng.uniform(-1, 1, size=(t, 7)).astype(np.float32),
        "observation.images.image": rng.integers(0, 255, size=(t, RECORD_SIZE, RECORD_SIZE, 3), dtype=np.uint8),
        "observation.images.wrist_image": rng.integers(0, 255, size=(t, RECORD_SIZE, RECORD_SIZE, 3), dtype=np.uint8),
    }
    return {
        "task_id": task_id,
        "init_state": init,
        "task": f"task {task_id}",
        "success": init != 99,
        "frames": frames,
        "length": t,
        "noops_dropped": 0,
    }


def record_config(**kw):
    """A two-task, two-episode RecordConfig at RECORD_SIZE (keywords override)."""
    from tutorial_utils.sim import record as rec

    base = dict(suite="libero_spatial", task_ids=(0, 1), episodes_per_task=2, image_size=RECORD_SIZE)
    base.update(kw)
    return rec.RecordConfig(**base)


# --- LeRobot families at a tiny size ---------------------------------------------------------------
LEROBOT_SIZE = 32
#: tiny sizes: a few seconds per family on one core (the ResNet-18 backbone is most of it)
LEROBOT_TINY = {
    "act": {
        "image_size": LEROBOT_SIZE,
        "chunk_size": 8,
        "n_action_steps": 4,
        "dim_model": 32,
        "n_heads": 2,
        "dim_feedforward": 64,
        "n_encoder_layers": 1,
        "n_vae_encoder_layers": 1,
        "latent_dim": 8,
    },
    "diffusion": {
        "image_size": LEROBOT_SIZE,
        "horizon": 8,
        "n_action_steps": 4,
        "down_dims": "16,32",
        "diffusion_step_embed_dim": 16,
        "n_groups": 4,
        "num_inference_steps": 2,
        "spatial_softmax_num_keypoints": 8,
    },
    "vqbet": {
        "image_size": LEROBOT_SIZE,
        "action_chunk_size": 4,
        "n_vqvae_training_steps": 1,  # step 1 fits the residual VQ, step 2 trains the GPT
        "vqvae_n_embed": 4,
        "vqvae_embedding_dim": 16,
        "vqvae_enc_hidden_dim": 16,
        "gpt_n_layer": 1,
        "gpt_n_head": 2,
        "gpt_hidden_dim": 32,
        "spatial_softmax_num_keypoints": 8,
    },
}


# --- the zoo's catalogue against the policy registry (test_experiments_zoo, test_policies_seam) ---
def check_catalog_matches_registry() -> None:
    """Every family the guide names is in the registry, and every registered family that trains or
    names a GPU recipe is in the catalog (mlp is the book's own baseline, not a guide family)."""
    from tutorial_utils import policies
    from tutorial_utils.experiments import catalog

    cat = catalog.catalog()
    registered = set(policies.available())
    assert set(cat.index) <= registered
    # (a test that registers a family of its own restores the registry afterwards: the `registry` fixture)
    ours = set(policies.trainable()) | set(policies.gpu_server())
    assert ours - {"mlp"} == set(cat.index)
    assert set(cat.index[cat["in the comparison"]]) == set(catalog.comparison_families())
    assert cat.loc["smolvla", "GPU server"] and not cat.loc["smolvla", "trains here"]
    # the RL rows say what ran: SAC a smoke test the trainer does not train; TD-MPC trained offline, evaluated
    assert not cat.loc["sac", "trains here"]
    assert "smoke test" in cat.loc["sac", "here"] and "never evaluated in LIBERO" in cat.loc["sac", "here"]
    assert cat.loc["tdmpc", "trains here"] and "evaluated in LIBERO" in cat.loc["tdmpc", "here"]
    assert "never trained online" in cat.loc["tdmpc", "here"]


# --- a stand-in for LIBERO in the evaluation loop ---------------------------------------------------
class FakeEnv:
    """Just enough of tutorial_utils.sim.libero_env.LiberoEnv: x moves by the action's first value and
    the episode succeeds once x reaches the goal, ``goal`` everywhere or ``goals[task_id][init_state]``
    (so one task can mix successes and failures and a wrong init state shows in the results)."""

    def __init__(self, task_id, goal=6.0, size=128, goals: dict | None = None, num_init_states: int = 50):
        self.task_id, self.goal, self.size, self.goals = int(task_id), goal, size, goals
        self.task_language = f"fake task {task_id}"
        self.num_init_states = num_init_states
        self.actions, self.priv_calls, self.x = [], 0, 0.0

    class info:  # noqa: N801
        @staticmethod
        def to_dict():
            return {"suite": "libero_spatial", "objects_of_interest": ["bowl", "plate"]}

    def reset(self, init_state=0):
        self.x, self.actions = 0.0, []
        if self.goals is not None:
            self.goal = self.goals[self.task_id][init_state]
        return {"x": self.x}

    def step(self, a):
        self.actions.append(np.asarray(a))
        self.x += float(a[0])
        return {"x": self.x}, 0.0, False, {}

    def check_success(self):
        return self.x >= self.goal

    def images(self, obs, scale: float = 1.0):
        img = np.full((self.size, self.size, 3), int(obs["x"] * scale) % 255, np.uint8)
        return img, img

    def state_vector(self, obs):
        return np.full(8, obs["x"], np.float32)

    def privileged_observation(self):
        self.priv_calls += 1
        return {"x": self.x}

    def close(self):
        pass


# --- headless Chromium (the browser tests of the built book and of JupyterLab) ---------------------
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def headless_chrome(width: int = 1280, height: int = 1600):
    """A Selenium driver of headless Chromium at ``width`` x ``height``, its console log kept (the
    caller quits it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
    ):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    d.set_page_load_timeout(60)
    d.implicitly_wait(0)
    return d


def comparable_results(res: dict) -> dict:
    """An evaluation's results without timings and where they were written: equal for the same
    episodes however many shards or client processes ran them."""
    out = json.loads(json.dumps(res))
    out.pop("wall_s")
    for key in ("output_dir", "shard", "num_shards", "workers", "port"):
        out["config"].pop(key)
    out.pop("parts", None)
    for t in out["tasks"]:
        for e in t["episodes"]:
            for key in ("wall_s", "round_trip_ms", "server_infer_ms"):
                e.pop(key)
    return out
