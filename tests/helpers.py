"""Small helpers shared by the test modules (importable as ``helpers``: pytest puts tests/ on
sys.path for the modules here and in tests/adversarial/)."""

from __future__ import annotations

import os
import time

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

    return pytest.importorskip(
        "lerobot", reason="LeRobot 0.4.4 is not installed: `make setup` installs requirements-lerobot04.txt"
    )


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
