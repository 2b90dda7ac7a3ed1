"""The open-loop check: a checkpoint replayed on demonstrations, before any simulator runs.

A served policy gets each recorded frame exactly as our LIBERO client would send it (the cameras
resized to the policy's ``image_size``, the 8-D state, the task's prompt, one ``episode_id`` per
episode, the frames between two predictions sent ``observe_only`` so a policy with observation
history sees them), and its reply is set beside the actions the expert took from that frame.
Three numbers come out of it:

- **the action error**: mean |predicted - demonstrated| over the actions the client would execute
  (``replan_steps`` of each chunk), per action dimension. A wiring defect (a camera swapped, an
  image upside down, a wrong normalisation) shows here as an error far above the validation error
  the trainer logged; a policy with a low error here that fails in the simulator fails in closed
  loop (drift, states the demonstrations never visited), not in its plumbing;
- **what the policy reads**: how much its actions move when the two cameras are replaced by
  another demonstration's frames at the same step (``reads_cameras``), and when the state is
  (``reads_state``). A policy that barely moves with the cameras steers by its own arm pose, so it
  cannot find an object that is somewhere else.

``python -m tutorial_utils openloop --checkpoint RUN/checkpoints/best [RUN2/...] --dataset DIR [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

#: action dimension names, in LIBERO's order
ACTION_NAMES = ("x", "y", "z", "roll", "pitch", "yaw", "gripper")


class OpenLoopError(ValueError):
    pass


def _episodes(n: int, episodes: Any) -> list[int]:
    if episodes is None:
        return list(range(n))
    eps = [int(e) for e in (str(episodes).split(",") if isinstance(episodes, str) else episodes)]
    bad = [e for e in eps if not 0 <= e < n]
    if bad:
        raise OpenLoopError(f"episodes {bad} are not in the dataset: it has episodes 0..{n - 1}")
    if len(eps) < 2:
        raise OpenLoopError(
            "name at least two episodes: what the policy reads is measured by swapping in another episode's frames"
        )
    return eps


def _request(ds, ep: int, f: int, size: int | None, state_ep: int | None = None, image_ep: int | None = None) -> dict:
    """The openpi request our client would send at frame ``f`` of episode ``ep`` (a camera or the
    state may come from another episode, at the same step or its last)."""
    import numpy as np

    from tutorial_utils.data.images import resize
    from tutorial_utils.policies import base as P

    ie = ep if image_ep is None else image_ep
    se = ep if state_ep is None else state_ep
    fi, fs = min(f, int(ds.lengths[ie]) - 1), min(f, int(ds.lengths[se]) - 1)
    primary, wrist = ds.video_keys[0], ds.video_keys[1]
    low = ds._lowdim(se)
    task = ds._lowdim(ep).get("task_index")
    return {
        P.IMAGE_KEY: resize(ds.frame(ie, primary, fi), size),
        P.WRIST_KEY: resize(ds.frame(ie, wrist, fi), size),
        P.STATE_KEY: np.asarray(low["observation.state"][fs], np.float32),
        P.PROMPT_KEY: ds.tasks.get(int(task[min(f, len(task) - 1)]) if task is not None else 0, ""),
    }


def open_loop(
    checkpoint: str | os.PathLike,
    dataset: str | os.PathLike,
    episodes: Any = None,
    every: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Replay ``dataset``'s demonstrations (``episodes``: all by default) through ``checkpoint`` as
    the served policy, predicting every ``every`` frames (default: the policy's ``replan_steps``,
    as in the simulator). Returns the action error per dimension, the first action's error, and
    how much the actions move when the cameras or the state come from another episode."""
    import numpy as np
    from tqdm.auto import tqdm

    from tutorial_utils.data.reader import LeRobotDataset
    from tutorial_utils.policies import base as P
    from tutorial_utils.policies import make_policy
    from tutorial_utils.policies.checkpoint import read_checkpoint_config
    from tutorial_utils.train.data import _in_data

    root = _in_data(dataset)
    if not (root / "meta" / "info.json").is_file():
        raise OpenLoopError(f"{root}/meta/info.json not found: {root} is not a LeRobot v2.1 dataset")
    ds = LeRobotDataset(root, verify_videos=False)
    if len(ds.video_keys) < 2:
        raise OpenLoopError(
            f"{root}/meta/info.json: the served policies read two cameras, the dataset has {ds.video_keys}"
        )
    eps = _episodes(ds.num_episodes, episodes)
    family = read_checkpoint_config(checkpoint)["family"]
    policy = make_policy(family, str(checkpoint))
    meta = policy.metadata
    size, replan = meta.get("image_size"), int(meta.get("replan_steps") or meta.get("action_horizon") or 1)
    step = int(every or replan)
    history = int(meta.get("n_obs_steps") or 1) > 1
    errors, first, moved_cam, moved_state = [], [], [], []
    bar = tqdm(
        total=sum(int(ds.lengths[e]) for e in eps), desc=f"open loop {family}", unit="frame", disable=not progress
    )
    for k, ep in enumerate(eps):
        other = eps[(k + 1) % len(eps)]
        actions = np.asarray(ds._lowdim(ep)["action"], np.float32)
        n = len(actions)
        policy.reset()
        for f in range(n):
            bar.update(1)
            request = {**_request(ds, ep, f, size), P.EPISODE_KEY: f"ep{ep}"}
            if f % step:
                if history:  # the frames between two predictions join the history, as our client sends them
                    policy.infer({**request, P.OBSERVE_ONLY_KEY: True})
                continue
            got = np.asarray(policy.infer(request)["actions"], np.float32)[:replan]
            m = min(len(got), n - f)
            errors.append(np.abs(got[:m] - actions[f : f + m]))
            first.append(np.abs(got[0] - actions[f]))
            # what it reads: one request with another episode's cameras (then state), history cleared
            # around it, so the comparison is one frame against one frame
            solo = _solo(policy, request)
            for swapped, into in (("image", moved_cam), ("state", moved_state)):
                alt = _request(ds, ep, f, size, **{f"{swapped}_ep": other})
                into.append(float(np.abs(_solo(policy, {**alt, P.EPISODE_KEY: "swap"}) - solo).mean()))
            policy.reset()
            if history:  # rebuild this episode's history up to frame f
                for g in range(max(0, f - int(meta.get("n_obs_steps") or 1) + 1), f + 1):
                    policy.infer({**_request(ds, ep, g, size), P.EPISODE_KEY: f"ep{ep}", P.OBSERVE_ONLY_KEY: True})
    bar.close()
    err = np.concatenate(errors)
    per_dim = err.mean(axis=0)
    return {
        "kind": "open_loop",
        "family": family,
        "checkpoint": _shown(checkpoint),
        "dataset": root.name,
        "episodes": eps,
        "predictions": len(first),
        "replan_steps": replan,
        "every": step,
        "n_obs_steps": int(meta.get("n_obs_steps") or 1),
        "action_mae": round(float(err.mean()), 4),
        "action_mae_per_dim": {name: round(float(v), 4) for name, v in zip(ACTION_NAMES, per_dim)},
        "first_action_mae": round(float(np.mean(first)), 4),
        "reads_cameras": round(float(np.mean(moved_cam)), 4),
        "reads_state": round(float(np.mean(moved_state)), 4),
    }


def _solo(policy, request: dict):
    """The executed part of one prediction from ``request`` alone (no history before it)."""
    import numpy as np

    policy.reset()
    return np.asarray(policy.infer(request)["actions"], np.float32)


def _shown(checkpoint) -> str:
    """``<run>/checkpoints/<name>``: the run's folder name, never the machine's path."""
    p = Path(checkpoint)
    return f"{p.parent.parent.name}/checkpoints/{p.name}" if p.parent.name == "checkpoints" else p.name


def table(results: list[dict]):
    """One row per checkpoint: the action error (all, first action, x/y/z, gripper) and what it reads."""
    import pandas as pd

    rows = []
    for r in results:
        d = r["action_mae_per_dim"]
        rows.append(
            {
                "family": r.get("label") or r["family"],
                "action error": r["action_mae"],
                "first action": r["first_action_mae"],
                "x": d["x"],
                "y": d["y"],
                "z": d["z"],
                "gripper": d["gripper"],
                "moves with cameras": r["reads_cameras"],
                "moves with state": r["reads_state"],
            }
        )
    return pd.DataFrame(rows).set_index("family")


def figure(results: list[dict]):
    """Two panels per checkpoint: its action error against the demonstrations (all executed actions,
    and the first one), and how far its actions move when the cameras, or the state, come from
    another demonstration at the same step."""
    from matplotlib.figure import Figure

    labels = [r.get("label") or r["family"] for r in results]
    y = list(range(len(results)))
    fig = Figure(figsize=(11, 0.5 * len(results) + 2.0), layout="constrained")
    ax_err, ax_reads = fig.subplots(1, 2, sharey=True)
    h = 0.38
    ax_err.barh([i - h / 2 for i in y], [r["action_mae"] for r in results], h, label="executed actions", color="C0")
    ax_err.barh([i + h / 2 for i in y], [r["first_action_mae"] for r in results], h, label="first action", color="C7")
    ax_err.set(title="open-loop action error (lower is better)", xlabel="mean |predicted - demonstrated|")
    ax_reads.barh([i - h / 2 for i in y], [r["reads_cameras"] for r in results], h, label="cameras swapped", color="C2")
    ax_reads.barh([i + h / 2 for i in y], [r["reads_state"] for r in results], h, label="state swapped", color="C3")
    ax_reads.set(title="what it reads: how far its actions move", xlabel="mean |change in action|")
    ax_err.set_yticks(y, labels)
    ax_err.invert_yaxis()
    for ax in (ax_err, ax_reads):
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    return fig


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tutorial_utils openloop",
        description="Replay recorded demonstrations through checkpoints as served policies: the action error per "
        "dimension, and how much their actions move when the cameras or the state come from another episode.",
    )
    ap.add_argument("--checkpoint", required=True, nargs="+", help="checkpoint directories (RUN/checkpoints/best)")
    ap.add_argument("--dataset", required=True, help="a LeRobot v2.1 dataset (a folder, or a name under data/)")
    ap.add_argument("--episodes", default=None, help="comma-separated episode indices (default: all)")
    ap.add_argument("--every", type=int, default=None, help="predict every N frames (default: replan_steps)")
    ap.add_argument("--label", nargs="+", default=None, help="each checkpoint's name in the table (default: family)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args(argv)
    if a.label and len(a.label) != len(a.checkpoint):
        print(f"error: --label names {len(a.label)} rows for {len(a.checkpoint)} checkpoints; give one per checkpoint")
        return 2
    results = []
    try:
        for i, ck in enumerate(a.checkpoint):
            r = open_loop(ck, a.dataset, episodes=a.episodes, every=a.every)
            if a.label:
                r["label"] = a.label[i]
            results.append(r)
    except OpenLoopError as exc:
        print(f"error: {exc}")
        return 2
    print(table(results).to_string())
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        doc = {"kind": "open_loop", "dataset": results[0]["dataset"], "results": results}
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {a.out}")
    return 0
