"""Inside TD-MPC's world model: does its latent tell the recorded frames apart, and what reward
does it predict where the demonstrations were rewarded?

TD-MPC decides everything (the planner and its policy head) from the latent its encoder computes
from the camera and the state. The open-loop check (:mod:`tutorial_utils.evaluate.openloop`) sees
only the actions; this probe opens the model on the same demonstrations, as its training windows
hold them, and compares a trained checkpoint with the same model untrained (same config, freshly
initialised), which is the baseline a collapse is measured against:

- **spread**: how much of the latent's size varies from frame to frame,
  ``sqrt(mean_d var_d(z)) / sqrt(mean(z**2))`` (0: every frame has the same latent);
- **effective dimensions**: the participation ratio of the latent's covariance eigenvalues
  ``(sum l)**2 / sum l**2`` (how many directions the frames spread along);
- **moves with the camera / with the state**: the mean change of ``z`` when a frame's camera (or its
  state) is swapped for another frame's, relative to the mean distance between two frames' latents;
- **predicted reward** where the recording gave reward (the last action of each demonstration)
  and everywhere else, and the value ``V(z)`` on the frames before a reward against the rest.

``python -m tutorial_utils latent --checkpoint RUN/checkpoints/best --dataset DIR [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


class LatentProbeError(ValueError):
    pass


def latent_summary(z, z_image_swapped=None, z_state_swapped=None) -> dict[str, float]:
    """Spread, effective dimensions and (given the swapped latents) how far ``z`` (N, D) moves
    with the camera and with the state, each relative to the typical distance between two frames."""
    import numpy as np

    z = np.asarray(z, np.float64)
    if z.ndim != 2 or len(z) < 2:
        raise LatentProbeError(f"latents of shape {z.shape}: need (frames >= 2, latent_dim)")
    centred = z - z.mean(axis=0)
    rms = float(np.sqrt(np.mean(z**2)))
    spread = float(np.sqrt(np.mean(centred**2)))  # sqrt of the mean over dimensions of each one's variance
    eig = np.clip(np.linalg.eigvalsh(np.cov(centred, rowvar=False)), 0.0, None)
    out = {
        "latent_rms": round(rms, 4),
        "spread": round(spread / rms, 4) if rms > 0 else 0.0,
        "effective_dims": round(float(eig.sum() ** 2 / (eig**2).sum()), 2) if eig.sum() > 0 else 0.0,
    }
    pair = float(np.mean(np.linalg.norm(z - np.roll(z, len(z) // 2, axis=0), axis=1)))
    for name, other in (("moves_with_camera", z_image_swapped), ("moves_with_state", z_state_swapped)):
        if other is not None:
            moved = float(np.mean(np.linalg.norm(np.asarray(other, np.float64) - z, axis=1)))
            out[name] = round(moved / pair, 4) if pair > 0 else 0.0
    return out


def _windows(model, dataset, episodes, every: int):
    import numpy as np

    from tutorial_utils.train.data import open_dataset

    source = open_dataset(dataset)
    windows = model.training_source(source)
    ep = np.asarray(windows.frame_episode)
    eps = sorted(set(ep.tolist())) if episodes is None else [int(e) for e in str(episodes).split(",")]
    missing = sorted(set(eps) - set(ep.tolist()))
    if missing:
        raise LatentProbeError(f"episodes {missing} are not in {dataset}: it has episodes 0..{int(ep.max())}")
    idx = []
    for e in eps:
        frames = np.nonzero(ep == e)[0]
        keep = set(frames[::every].tolist()) | {int(frames[-1])}  # every N frames, and the rewarded last one
        # the window that holds the demonstration's reward: the one starting `horizon` frames before the end
        keep.add(int(max(frames[0], frames[-1] - model.cfg.horizon + 1)))
        idx += sorted(keep)
    return windows, idx, eps


def probe_model(model, windows, indices, batch_size: int = 64) -> dict[str, Any]:
    """The latent, its swaps, the predicted and recorded rewards and V of ``model`` on ``indices``."""
    import numpy as np
    import torch

    from tutorial_utils.policies.lerobot_rl import WINDOW

    model.eval()
    parts: dict[str, list] = {}
    for a in range(0, len(indices), batch_size):
        batch = windows.batch(indices[a : a + batch_size])
        got = model.probe(batch)
        half = max(1, len(indices[a : a + batch_size]) // 2)
        for swapped in ("image", "state"):  # another frame's camera (or state), the rest unchanged
            alt = dict(batch)
            keys = [k for k in batch if k.startswith(WINDOW) and (("state" in k) == (swapped == "state"))]
            for k in keys:
                alt[k] = torch.roll(batch[k], half, dims=0)
            got[f"z_{swapped}_swapped"] = model.probe(alt)["z"]
        for k, v in got.items():
            parts.setdefault(k, []).append(v.detach().float().cpu().numpy())
    return {k: np.concatenate(v) for k, v in parts.items()}


def rewards_summary(p: dict[str, Any]) -> dict[str, Any]:
    """Predicted reward where the recording rewarded and elsewhere; V before a reward and elsewhere."""
    import numpy as np

    valid = ~p["reward_is_pad"].astype(bool)
    rewarded = valid & (p["reward"] > 0)
    other = valid & ~(p["reward"] > 0)
    near_end = rewarded.any(axis=1)  # windows whose rollout reaches the demonstration's reward
    return {
        "rewarded_steps": int(rewarded.sum()),
        "reward_pred_at_reward": round(float(p["reward_pred"][rewarded].mean()), 4) if rewarded.any() else None,
        "reward_pred_elsewhere": round(float(p["reward_pred"][other].mean()), 4) if other.any() else None,
        "reward_pred_elsewhere_max": round(float(np.abs(p["reward_pred"][other]).max()), 4) if other.any() else None,
        "value_near_reward": round(float(p["value"][near_end].mean()), 4) if near_end.any() else None,
        "value_elsewhere": round(float(p["value"][~near_end].mean()), 4) if (~near_end).any() else None,
        "value_std": round(float(p["value"].std()), 4),
    }


def probe(
    checkpoint: str | os.PathLike, dataset: str | os.PathLike, episodes: Any = None, every: int = 5, seed: int = 0
) -> dict[str, Any]:
    """The probe of a TD-MPC ``checkpoint`` and of the same model untrained (``seed``) on ``dataset``'s
    training windows (``episodes``: all by default; every ``every``-th frame, and each demonstration's
    rewarded window). Returns both rows."""
    import torch

    from tutorial_utils import policies
    from tutorial_utils.policies.checkpoint import read_checkpoint_config

    family = read_checkpoint_config(checkpoint)["family"]
    if not hasattr(policies.family(family), "probe"):
        raise LatentProbeError(
            f"{checkpoint}: a {family!r} checkpoint; the latent probe opens a world model (policy 'tdmpc')"
        )
    if every < 1:
        raise LatentProbeError(f"--every {every}: probe every N >= 1 frames")
    trained = policies.load(checkpoint)
    torch.manual_seed(seed)
    untrained = policies.make(family, trained.cfg, trained.statistics)
    windows, idx, eps = _windows(trained, dataset, episodes, every)
    rows = []
    for label, model, where in (("trained", trained, _shown(checkpoint)), ("untrained", untrained, f"seed {seed}")):
        p = probe_model(model, windows, idx)
        rows.append(
            {
                "label": label,
                "checkpoint": where,
                **latent_summary(p["z"], p["z_image_swapped"], p["z_state_swapped"]),
                **rewards_summary(p),
            }
        )
    return {
        "kind": "latent_probe",
        "family": family,
        "training": training_of(checkpoint),
        "dataset": Path(str(dataset)).name,
        "episodes": eps,
        "frames": len(idx),
        "every": every,
        "results": rows,
    }


def training_of(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """The training run a checkpoint came from (``RUN/checkpoints/NAME``): its steps, samples/s and
    best validation action error, from ``RUN/summary.json``; empty for a checkpoint outside a run."""
    run = Path(checkpoint).resolve().parent.parent
    f = run / "summary.json"
    if not f.is_file():
        return {}
    s = json.loads(f.read_text(encoding="utf-8"))
    best = s.get("best") or {}
    return {
        "run": _shown(run),
        "steps": s.get("steps_done"),
        "batch_size": s.get("batch_size"),
        "best_val_action_mae": best.get("val_action_mae"),
        "best_step": best.get("step"),
    }


def _shown(checkpoint) -> str:
    from tutorial_utils import paths

    return paths.for_book(os.fspath(checkpoint))


def table(doc: dict[str, Any]):
    """The probe's rows as a table, one column per model."""
    import pandas as pd

    return pd.DataFrame({r["label"]: {k: v for k, v in r.items() if k not in ("label",)} for r in doc["results"]})


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tutorial_utils latent",
        description="Open a TD-MPC checkpoint's world model on recorded demonstrations, beside the same model "
        "untrained: how far its latent tells frames apart, what moves it, and the rewards it predicts.",
    )
    ap.add_argument("--checkpoint", required=True, help="a TD-MPC checkpoint directory (RUN/checkpoints/best)")
    ap.add_argument("--dataset", required=True, help="a LeRobot v2.1 dataset (a folder, or a name under data/)")
    ap.add_argument("--episodes", default=None, help="comma-separated episode indices (default: all)")
    ap.add_argument("--every", type=int, default=5, help="probe every N frames (and each rewarded window)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args(argv)
    try:
        doc = probe(a.checkpoint, a.dataset, episodes=a.episodes, every=a.every)
    except LatentProbeError as exc:
        print(f"error: {exc}")
        return 2
    print(f"{doc['frames']} frames of {len(doc['episodes'])} demonstrations of {doc['dataset']}")
    print(table(doc).to_string())
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {a.out}")
    return 0
