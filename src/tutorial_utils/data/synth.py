"""Synthetic LeRobot v2.1 datasets with the LIBERO schema, of any size.

For tests, benchmarks and the book's ``ci`` profile before real demos exist. The content is
plausible, not real: an end effector moves smoothly from a start pose towards a goal, the
gripper closes half way and opens near the end, actions are the (clipped, scaled) pose
deltas, and both cameras show a simple drawn scene (a table, a "bowl" that follows the end
effector after the grasp, a "plate") so frames change with the state.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from tutorial_utils.data.libero_schema import LIBERO_CAMERAS, LIBERO_FPS, LIBERO_ROBOT_TYPE, libero_features
from tutorial_utils.data.writer import LeRobotWriter

#: Task strings in the style of libero_spatial (the real suite's ten tasks are longer).
SYNTH_TASKS = (
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "pick up the black bowl next to the ramekin and place it on the plate",
    "pick up the black bowl from table center and place it on the plate",
    "pick up the black bowl on the cookie box and place it on the plate",
    "pick up the black bowl in the top drawer of the wooden cabinet and place it on the plate",
    "pick up the black bowl on the ramekin and place it on the plate",
    "pick up the black bowl next to the cookie box and place it on the plate",
    "pick up the black bowl on the stove and place it on the plate",
    "pick up the black bowl next to the plate and place it on the plate",
    "pick up the black bowl on the wooden cabinet and place it on the plate",
)


def synth_episode(length: int, image_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One synthetic episode: ``observation.state`` (T,8), ``action`` (T,7), two (T,S,S,3) videos."""
    t = int(length)
    start = np.array([-0.2, 0.0, 1.17]) + rng.normal(0, 0.03, 3)
    goal = np.array([0.05, 0.15, 0.95]) + rng.normal(0, 0.05, 3)
    s = np.linspace(0.0, 1.0, t)
    ease = 0.5 - 0.5 * np.cos(np.pi * s)
    pos = start + ease[:, None] * (goal - start) + 0.01 * np.sin(6 * s)[:, None] * rng.normal(0, 1, 3)
    rot = np.array([3.14, 0.0, 0.0]) + np.cumsum(rng.normal(0, 0.004, (t, 3)), axis=0)
    closed = (s > 0.45) & (s < 0.9)
    finger = np.where(closed, 0.01, 0.04)
    state = np.concatenate([pos, rot, finger[:, None], -finger[:, None]], axis=1).astype(np.float32)
    dpos = np.diff(pos, axis=0, append=pos[-1:]) / 0.05 * 5  # 1.0 ~ 5 cm
    drot = np.diff(rot, axis=0, append=rot[-1:]) / 0.5
    grip = np.where(closed, -1.0, 1.0)  # the published datasets' convention: +1 open, -1 close
    action = np.clip(np.concatenate([dpos, drot, grip[:, None]], axis=1), -1, 1).astype(np.float32)
    frames = {key: _render(pos, closed, image_size, wrist=(i == 1), rng=rng) for i, key in enumerate(LIBERO_CAMERAS)}
    return {"observation.state": state, "action": action, **frames}


def _render(pos: np.ndarray, closed: np.ndarray, size: int, wrist: bool, rng: np.random.Generator) -> np.ndarray:
    """Cheap drawing: a textured table, a plate, a bowl, the gripper as a dark square."""
    t = len(pos)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    base = np.stack([0.55 + 0.1 * yy, 0.42 + 0.08 * xx, 0.3 + 0.05 * yy], -1)
    base = (base * 255).astype(np.uint8)
    out = np.empty((t, size, size, 3), dtype=np.uint8)
    plate = np.array([0.7, 0.65])
    bowl = np.array([0.3, 0.35]) + rng.normal(0, 0.03, 2)
    r = max(1, size // 10)
    for i in range(t):
        img = base.copy()
        g = np.array([0.5 + 1.2 * (pos[i, 1]), 0.5 + 1.2 * (pos[i, 0] + 0.1)])
        if closed[i]:
            bowl = g.copy()
        if wrist:  # the wrist camera sees the scene shifted by the end-effector position
            shift = g - 0.5
            centres = [(plate - shift, (235, 235, 235), 1.6), (bowl - shift, (25, 25, 30), 1.0)]
        else:
            centres = [(plate, (235, 235, 235), 1.6), (bowl, (25, 25, 30), 1.0), (g, (60, 60, 160), 0.6)]
        for c, colour, scale in centres:
            cy, cx = (np.clip(c, 0, 1) * (size - 1)).astype(int)
            rr = max(1, int(r * scale))
            img[max(cy - rr, 0) : cy + rr, max(cx - rr, 0) : cx + rr] = colour
        out[i] = img
    return out


def generate_dataset(
    root: str | os.PathLike,
    n_episodes: int = 3,
    mean_length: int = 20,
    image_size: int = 32,
    n_tasks: int = 2,
    seed: int = 0,
    *,
    lengths: list[int] | None = None,
    fps: int = LIBERO_FPS,
    overwrite: bool = False,
    finalize: bool = True,
    preset: str = "ultrafast",
    progress: bool = False,
) -> Path:
    """Write (or complete) a synthetic LIBERO-schema dataset at ``root``; returns ``root``.

    Episode lengths vary around ``mean_length`` (+-25 %) unless ``lengths`` gives them.
    An existing dataset with the same schema is resumed (episodes already there are kept);
    ``overwrite`` deletes ``root`` first. Deterministic for a given ``seed``.
    """
    root = Path(root)
    if overwrite and root.exists():
        shutil.rmtree(root)
    rng = np.random.default_rng(seed)
    if lengths is None:
        lo, hi = max(2, int(mean_length * 0.75)), max(2, int(mean_length * 1.25))
        lengths = rng.integers(lo, hi + 1, size=n_episodes).tolist()
    if len(lengths) != n_episodes:
        raise ValueError(f"lengths has {len(lengths)} entries for {n_episodes} episodes")
    tasks = [SYNTH_TASKS[i % len(SYNTH_TASKS)] for i in range(max(1, n_tasks))]
    writer = LeRobotWriter(root, libero_features(image_size), fps, LIBERO_ROBOT_TYPE, preset=preset)
    try:
        for ep in range(writer.num_episodes, n_episodes):
            ep_rng = np.random.default_rng([seed, ep])
            writer.add_episode(synth_episode(lengths[ep], image_size, ep_rng), tasks[ep % len(tasks)])
            if progress and (ep + 1) % 50 == 0:
                print(f"  wrote {ep + 1}/{n_episodes} episodes", flush=True)
        if finalize:
            writer.finalize()
    finally:
        writer.close()
    return root


__all__ = ["SYNTH_TASKS", "synth_episode", "generate_dataset"]
