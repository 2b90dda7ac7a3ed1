"""Inside a trained model, beside the same model untrained: TD-MPC's latent, and the camera
keypoints of Diffusion Policy and VQ-BeT.

**TD-MPC**: does its latent tell the recorded frames apart, and what reward does it predict where
the demonstrations were rewarded?

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

**Diffusion Policy and VQ-BeT** see each camera through a ResNet whose last feature map (2x2 cells
for a 64 px image, 3x3 for 84 px) goes through a spatial softmax: per keypoint, a softmax over the
map's cells and the expected (x, y) position under it. The probe reports, per camera:

- **attention peak**: the mean over frames and keypoints of the largest softmax weight (one over
  the cells when the attention is flat; near 1 when each keypoint sits on one cell whatever the
  image shows, so its position cannot move);
- **keypoint spread**: the standard deviation across frames of the keypoint coordinates, averaged
  over them (0: the same keypoints for every frame);
- **feature spread** and **dead features**: the same for what the encoder hands on, and the share
  of its ReLU units that are zero on every frame.

``python -m tutorial_utils latent --checkpoint RUN/checkpoints/best --dataset DIR [--out FILE]``;
``--checkpoint RUN/checkpoints/step_*`` probes each saved step of one run (a series: when did it
settle).
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


def _windows(model, dataset, episodes, every: int, rewarded: bool = True):
    """The model's training windows on ``dataset``, the indices of every ``every``-th frame of
    ``episodes`` (with ``rewarded``: also each demonstration's last frame and the window that holds
    its reward), and the episodes."""
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
        keep = set(frames[::every].tolist())
        if rewarded:
            keep.add(int(frames[-1]))  # the rewarded last one
            # the window that holds the demonstration's reward: the one starting `horizon` frames before the end
            keep.add(int(max(frames[0], frames[-1] - model.cfg.horizon + 1)))
        idx += sorted(keep)
    return windows, idx, eps


def keypoints_summary(attention, keypoints, features) -> dict[str, float]:
    """Attention peak, keypoint spread, feature spread and dead features (see the module's text) of
    one camera's encoder over N frames: ``attention`` (N, K, cells), ``keypoints`` (N, 2K),
    ``features`` (N, D)."""
    import numpy as np

    att, kp, ft = (np.asarray(a, np.float64) for a in (attention, keypoints, features))
    if att.ndim != 3 or len(att) < 2:
        raise LatentProbeError(f"attention of shape {att.shape}: need (frames >= 2, keypoints, cells)")
    return {
        "cells": int(att.shape[-1]),
        "attention_peak": round(float(att.max(axis=-1).mean()), 4),
        "attention_peak_if_flat": round(1.0 / att.shape[-1], 4),
        "keypoint_spread": round(float(kp.std(axis=0).mean()), 5),
        "feature_spread": round(float(ft.std(axis=0).mean()), 5),
        "dead_features": round(float((ft <= 0).all(axis=0).mean()), 3),
    }


def probe_cameras(model, windows, indices, batch_size: int = 64) -> dict[str, dict[str, Any]]:
    """``model.probe_cameras`` on the frames ``indices`` of ``windows`` (resized to its image size,
    as the trainer hands them over, without its random shifts), per camera."""
    import numpy as np
    import torch

    from tutorial_utils.train.data import WindowDataset, collate, random_shift

    model.eval()
    data = WindowDataset(windows, np.asarray(indices), model.cfg.action_horizon, model.cfg.image_size)
    parts: dict[str, dict[str, list]] = {}
    for a in range(0, len(indices), batch_size):
        items = [data[int(i)] for i in indices[a : a + batch_size]]
        batch = random_shift(collate(items), 0, torch.Generator())  # float images, unshifted
        for cam, got in model.probe_cameras(batch).items():
            for k in ("attention", "keypoints", "features"):
                parts.setdefault(cam, {}).setdefault(k, []).append(got[k].float().cpu().numpy())
    return {cam: {k: np.concatenate(v) for k, v in got.items()} for cam, got in parts.items()}


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
    checkpoint: str | os.PathLike,
    dataset: str | os.PathLike,
    episodes: Any = None,
    every: int = 5,
    seed: int = 0,
    untrained_rows: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The probe of a TD-MPC ``checkpoint`` and of the same model untrained (``seed``) on ``dataset``'s
    training windows (``episodes``: all by default; every ``every``-th frame, and each demonstration's
    rewarded window). Returns both rows. ``untrained_rows``: the untrained rows of an earlier probe
    of the same run on the same frames, reused instead of probing the untrained model again."""
    import torch

    from tutorial_utils import policies
    from tutorial_utils.policies.checkpoint import read_checkpoint_config

    family = read_checkpoint_config(checkpoint)["family"]
    cls = policies.family(family)
    world_model = hasattr(cls, "probe")
    if every < 1:
        raise LatentProbeError(f"--every {every}: probe every N >= 1 frames")
    if not world_model and not hasattr(cls, "camera_encoders"):
        raise LatentProbeError(_nothing_to_open(checkpoint, family))
    trained = policies.load(checkpoint)
    if not world_model and not trained.camera_encoders():  # ACT: its ResNet is read by a transformer
        raise LatentProbeError(_nothing_to_open(checkpoint, family))
    models = [("trained", trained, _shown(checkpoint))]
    if untrained_rows is None:
        torch.manual_seed(seed)
        models.append(("untrained", policies.make(family, trained.cfg, trained.statistics), f"seed {seed}"))
    windows, idx, eps = _windows(trained, dataset, episodes, every, rewarded=world_model)
    rows = []
    for label, model, where in models:
        if not world_model:
            for cam, p in probe_cameras(model, windows, idx).items():
                rows.append({"label": f"{label}, {cam.split('.')[-1]}", "checkpoint": where, **keypoints_summary(**p)})
            continue
        p = probe_model(model, windows, idx)
        rows.append(
            {
                "label": label,
                "checkpoint": where,
                **latent_summary(p["z"], p["z_image_swapped"], p["z_state_swapped"]),
                **rewards_summary(p),
            }
        )
    rows += [dict(r) for r in untrained_rows or []]
    return {
        "kind": "latent_probe" if world_model else "camera_probe",
        "family": family,
        "training": training_of(checkpoint),
        "checkpoint_step": checkpoint_step(checkpoint),
        "dataset": Path(str(dataset)).name,
        "episodes": eps,
        "frames": len(idx),
        "every": every,
        "results": rows,
    }


def probe_series(
    checkpoints: list, dataset: str | os.PathLike, episodes: Any = None, every: int = 5, seed: int = 0, progress=None
) -> dict[str, Any]:
    """:func:`probe` of each of ``checkpoints`` (one run's ``step_*``, in training order), with the
    step of each and the first phase of the family (VQ-BeT's VQ-VAE steps), to see when a
    representation settles. ``progress``: a tqdm-like wrapper for the loop."""
    from tutorial_utils import policies
    from tutorial_utils.policies.checkpoint import read_checkpoint_config

    if len(checkpoints) < 2:
        raise LatentProbeError("a series needs two checkpoints or more (one run's step_* directories)")
    loop = progress(checkpoints) if progress else checkpoints
    # one run: one untrained twin, probed once on the same frames (again for a checkpoint whose
    # family or policy configuration differs from the first one's)
    probes, untrained, first = [], None, None
    for c in loop:
        cfg = read_checkpoint_config(c)
        same = first is not None and (cfg["family"], cfg.get("policy")) == first
        probes.append(
            probe(c, dataset, episodes=episodes, every=every, seed=seed, untrained_rows=untrained if same else None)
        )
        if first is None:
            first = (cfg["family"], cfg.get("policy"))
            untrained = [r for r in probes[0]["results"] if r["label"].startswith("untrained")]
    probes.sort(key=lambda d: d["checkpoint_step"] if d["checkpoint_step"] is not None else -1)
    family, policy_config = first
    return {
        "kind": "probe_series",
        "family": family,
        "first_phase_steps": policies.first_phase_steps(family, policy_config or {}),
        "probes": probes,
    }


def series_table(doc: dict[str, Any]):
    """A probe series as a table, one row per checkpoint step and camera: the trained numbers."""
    import pandas as pd

    rows = []
    for d in doc["probes"]:
        for r in d["results"]:
            if r["label"].startswith("trained"):
                rows.append({"step": d["checkpoint_step"], "model": r["label"].split(", ", 1)[-1], **r})
    keep = ("attention_peak", "keypoint_spread", "feature_spread", "dead_features", "spread", "effective_dims")
    df = pd.DataFrame(rows)
    return df[["step", "model", *[k for k in keep if k in df]]].set_index(["step", "model"])


def series_figure(doc: dict[str, Any]):
    """A camera-probe series: the attention peak and the keypoint spread of each checkpoint against
    its training step, beside the untrained model's (dashed) and a flat softmax's (dotted); the end of
    the family's first phase as a grey line."""
    from matplotlib.figure import Figure

    if not doc["probes"] or doc["probes"][0].get("kind") != "camera_probe":
        raise LatentProbeError("series_figure draws a series of camera probes (Diffusion Policy, VQ-BeT)")
    fig = Figure(figsize=(8, 3.2), layout="constrained")
    ax_peak, ax_spread = fig.subplots(1, 2)
    steps = [d["checkpoint_step"] for d in doc["probes"]]
    cams = [r["label"].split(", ", 1)[1] for r in doc["probes"][0]["results"] if r["label"].startswith("trained")]
    for i, cam in enumerate(cams):
        rows = [{r["label"]: r for r in d["results"]} for d in doc["probes"]]
        t = [r[f"trained, {cam}"] for r in rows]
        u = rows[0][f"untrained, {cam}"]
        ax_peak.plot(steps, [r["attention_peak"] for r in t], "o-", color=f"C{i}", label=cam)
        ax_peak.axhline(u["attention_peak"], color=f"C{i}", ls="--", lw=0.8)
        ax_spread.plot(steps, [r["keypoint_spread"] for r in t], "o-", color=f"C{i}", label=cam)
        ax_spread.axhline(u["keypoint_spread"], color=f"C{i}", ls="--", lw=0.8)
    ax_peak.axhline(doc["probes"][0]["results"][0]["attention_peak_if_flat"], color="k", ls=":", lw=0.8)
    ax_peak.set_ylim(0, 1.02)
    ax_spread.set_yscale("log")
    for ax, title in ((ax_peak, "attention peak (1: one cell)"), (ax_spread, "keypoint spread across frames")):
        if doc.get("first_phase_steps"):
            ax.axvline(doc["first_phase_steps"], color="0.6", lw=1)
        ax.set_xlabel("training step")
        ax.set_title(title, fontsize=10)
    ax_peak.legend(fontsize=8)
    fig.suptitle(f"{doc['family']}: the camera encoder's checkpoints (dashed: untrained)", fontsize=11)
    return fig


def checkpoint_step(checkpoint: str | os.PathLike) -> int | None:
    """The training step a checkpoint was saved at (its ``training_state.json``), or None."""
    f = Path(checkpoint) / "training_state.json"
    if not f.is_file():
        return None
    return json.loads(f.read_text(encoding="utf-8")).get("step")


def _nothing_to_open(checkpoint, family: str) -> str:
    return (
        f"{checkpoint}: a {family!r} checkpoint; the probe opens TD-MPC's world model (policy 'tdmpc') or the "
        "spatial-softmax camera keypoints of Diffusion Policy and VQ-BeT (policies 'diffusion', 'vqbet')"
    )


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


def _camera_rows(docs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per model and camera of camera probes (``{label: probe document}``): the trained and
    the untrained row side by side."""
    out = []
    for label, doc in docs.items():
        if doc.get("kind") != "camera_probe":
            raise LatentProbeError(
                f"{label}: not a camera probe (kind {doc.get('kind')!r}); probe a Diffusion or VQ-BeT checkpoint"
            )
        rows = {r["label"]: r for r in doc["results"]}
        several = sum(k.startswith("trained, ") for k in rows) > 1  # name the camera of a two-camera model
        for key, t in rows.items():
            state, cam = key.split(", ", 1)
            if state != "trained":
                continue
            u = rows[f"untrained, {cam}"]
            training = doc.get("training") or {}
            out.append(
                {
                    "model": f"{label}, {cam}" if several else label,
                    "cells": t["cells"],
                    "attention peak": t["attention_peak"],
                    "attention peak untrained": u["attention_peak"],
                    "keypoint spread": t["keypoint_spread"],
                    "keypoint spread untrained": u["keypoint_spread"],
                    "keypoints move (x untrained)": round(t["keypoint_spread"] / u["keypoint_spread"], 3)
                    if u["keypoint_spread"]
                    else None,
                    "dead features": t["dead_features"],
                    "steps": training.get("steps"),
                    "frames": doc.get("frames"),
                }
            )
    return out


def camera_table(docs: dict[str, dict[str, Any]]):
    """Camera probes of several checkpoints (``{label: probe document}``) as one table, a row per
    model and camera: the attention peak and keypoint spread trained and untrained, and how far the
    trained keypoints move across frames relative to the untrained ones."""
    import pandas as pd

    return pd.DataFrame(_camera_rows(docs)).set_index("model")


def camera_figure(docs: dict[str, dict[str, Any]]):
    """How far each model's camera keypoints move across frames, trained over untrained (log scale;
    1: as much as before training, far below: the keypoints stopped following the image)."""
    from matplotlib.figure import Figure

    rows = [r for r in _camera_rows(docs) if r["keypoints move (x untrained)"]]
    fig = Figure(figsize=(9, 0.45 * len(rows) + 1.4), layout="constrained")
    ax = fig.subplots()
    y = list(range(len(rows)))[::-1]
    ratios = [r["keypoints move (x untrained)"] for r in rows]
    ax.barh(y, ratios, color=["C3" if v < 0.5 else "C0" for v in ratios])
    ax.set_xscale("log")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(y, [r["model"] for r in rows])
    ax.set_xlabel("keypoint spread, trained / untrained (log scale)")
    ax.set_title("Do the keypoints still follow the image?")
    return fig


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tutorial_utils latent",
        description="Open a checkpoint on recorded demonstrations beside the same model untrained: TD-MPC's "
        "world model (how far its latent tells frames apart, what moves it, the rewards it predicts), or the "
        "camera keypoints of Diffusion Policy and VQ-BeT (do they still move with the image). Several "
        "checkpoints of one run (RUN/checkpoints/step_*) give a series: when did it settle.",
    )
    ap.add_argument(
        "--checkpoint",
        required=True,
        nargs="+",
        help="a TD-MPC, Diffusion Policy or VQ-BeT checkpoint directory (RUN/checkpoints/best), or several",
    )
    ap.add_argument("--dataset", required=True, help="a LeRobot v2.1 dataset (a folder, or a name under data/)")
    ap.add_argument("--episodes", default=None, help="comma-separated episode indices (default: all)")
    ap.add_argument("--every", type=int, default=5, help="probe every N frames (and each rewarded window)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args(argv)
    try:
        if len(a.checkpoint) > 1:
            from tqdm.auto import tqdm

            doc = probe_series(
                a.checkpoint, a.dataset, episodes=a.episodes, every=a.every, progress=lambda x: tqdm(x, desc="probe")
            )
            first = doc["probes"][0]
            print(
                f"{len(doc['probes'])} checkpoints, {first['frames']} frames of {len(first['episodes'])} demonstrations"
            )
            print(series_table(doc).to_string())
        else:
            doc = probe(a.checkpoint[0], a.dataset, episodes=a.episodes, every=a.every)
            print(f"{doc['frames']} frames of {len(doc['episodes'])} demonstrations of {doc['dataset']}")
            print(table(doc).to_string())
    except LatentProbeError as exc:
        print(f"error: {exc}")
        return 2
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {a.out}")
    return 0
