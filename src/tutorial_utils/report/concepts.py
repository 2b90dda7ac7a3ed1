"""Helpers for the concept chapter "What DiT4DiT is" (notebooks/02_dit4dit_concepts.md).

The chapter uses the mini policy (``tutorial_utils.policies.mini``) as a runnable specimen of
DiT4DiT's layout: it builds a batch from a synthetic LIBERO-style episode, records the tensor
shape at each stage of a real forward pass with forward hooks, counts the parameters that
freezing a module would leave trainable, follows one action chunk along the Euler steps of
the flow-matching head, and lays out the three time scales with their numbers.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: (module name, what it is) for the shape table, in the order data flows through them.
STAGES: tuple[tuple[str, str], ...] = (
    ("backbone.primary_encoder", "primary camera -> image tokens"),
    ("backbone.wrist_encoder", "wrist camera -> image tokens"),
    ("backbone.language_encoder", "instruction word ids -> word tokens"),
    ("backbone.state_encoder", "8-D state -> sin/cos (16) -> one token"),
    ("backbone", "context tokens + padding mask"),
    ("action_model.action_in", "noisy chunk a_t -> action tokens"),
    ("action_model.time_embed", "flow time t -> conditioning vector (adaLN)"),
    ("action_model.blocks.0", "DiT block: self-attn, cross-attn to context, MLP"),
    ("action_model", "predicted velocity (noise - a)"),
)

#: Names of the 7 action dimensions (FACTS 2: x..yaw, gripper).
ACTION_NAMES = ("x", "y", "z", "roll", "pitch", "yaw", "gripper")

#: Upstream figures, for the comparison with the mini policy (the seed's smoke-test log).
DIT4DIT_PARAMETERS = {"total": 10_641_307_643, "trainable": 163_073_544}


def describe(x: Any) -> str:
    """A compact shape string: ``2×8×7`` for a tensor/array, ``(a, b)`` for tuples, ``list[2]``."""
    shape = getattr(x, "shape", None)
    if shape is not None:
        return "×".join(str(int(s)) for s in shape) if len(shape) else "scalar"
    if isinstance(x, (tuple, list)):
        if x and all(isinstance(v, str) for v in x):
            return f"{len(x)} strings"
        return "(" + ", ".join(describe(v) for v in x) + ")"
    if isinstance(x, Mapping):
        return "{" + ", ".join(f"{k}: {describe(v)}" for k, v in x.items()) + "}"
    return type(x).__name__


def episode_batch(episode: Mapping[str, np.ndarray], starts: Sequence[int], horizon: int, instruction: str) -> dict:
    """A policy batch in LeRobot's key names from one episode (``synth.synth_episode`` /
    LeRobot column names).

    Each start frame gives the cameras and state at that frame and the next ``horizon``
    actions; steps past the episode's end repeat the last action and are masked out, as the
    training loader does."""
    from tutorial_utils.policies import base as B

    action = np.asarray(episode["action"], np.float32)
    n = len(action)
    rows = []
    for s in starts:
        if not 0 <= s < n:
            raise IndexError(f"start frame {s} is outside the episode (0..{n - 1})")
        idx = s + np.arange(horizon)
        rows.append((np.minimum(idx, n - 1), idx < n))
    first = list(starts)
    return {
        B.BATCH_IMAGE: np.asarray(episode[B.BATCH_IMAGE])[first],
        B.BATCH_WRIST: np.asarray(episode[B.BATCH_WRIST])[first],
        B.BATCH_STATE: np.asarray(episode[B.BATCH_STATE], np.float32)[first],
        B.BATCH_TASK: [instruction] * len(first),
        B.BATCH_ACTION: np.stack([action[i] for i, _ in rows]),
        B.BATCH_ACTION_IS_PAD: np.stack([~m for _, m in rows]),
    }


def action_statistics(action: np.ndarray) -> dict:
    """``dataset_statistics.json``'s layout for an (N, 7) action array (min-max on x..yaw,
    gripper raw, as DiT4DiT's ``libero_franka``), computed by :func:`tutorial_utils.data.stats.statistics_of`."""
    from tutorial_utils.data.stats import statistics_of

    return statistics_of(np.asarray(action, np.float32).reshape(-1, np.shape(action)[-1]))


def trace_shapes(
    policy, batch: Mapping[str, Any], stages: Sequence[tuple[str, str]] = STAGES, generator=None
) -> list[dict]:
    """Run one real training forward pass (``policy.loss``) and record, with forward hooks,
    the input and output shapes of each module in ``stages`` (its first call)."""
    import torch

    modules = dict(policy.named_modules())
    unknown = [name for name, _ in stages if name not in modules]
    if unknown:
        raise KeyError(f"no module(s) {unknown} in the policy; known: {[n for n in modules if n.count('.') < 2 and n]}")
    seen: dict[str, dict] = {}
    handles = []

    def hook_for(name: str, what: str):
        def hook(module, inputs, output):
            if name in seen:
                seen[name]["calls"] += 1
                return
            seen[name] = {
                "module": name,
                "what": what,
                "inputs": describe(tuple(inputs)),
                "output": describe(output),
                "calls": 1,
            }

        return hook

    try:
        for name, what in stages:
            handles.append(modules[name].register_forward_hook(hook_for(name, what)))
        with torch.no_grad():
            out = policy.loss(batch, generator)
    finally:
        for h in handles:
            h.remove()
    rows = [seen[name] for name, _ in stages if name in seen]
    rows.append(
        {
            "module": "loss",
            "what": "masked MSE to the target velocity",
            "inputs": "",
            "output": f"{float(out['total_loss']):.4f}",
            "calls": 1,
        }
    )
    return rows


def parameter_table(policy, depth: int = 2) -> list[dict]:
    """Parameters per module down to ``depth`` dotted levels, with their share of the total."""
    total = sum(p.numel() for p in policy.parameters())
    rows = []
    for name, mod in policy.named_modules():
        if not name or name.count(".") >= depth:
            continue
        n = sum(p.numel() for p in mod.parameters())
        rows.append({"module": name, "parameters": n, "share %": round(100.0 * n / total, 2)})
    return rows


def freeze_report(policy, names: Sequence[str]) -> dict:
    """What ``freeze_modules=names`` would leave trainable, counted on a copy (the policy is
    not touched): total, trainable, frozen and the trainable ratio in percent."""
    from tutorial_utils.train.prepare import apply_freeze

    twin = copy.deepcopy(policy)
    apply_freeze(twin, list(names))
    c = twin.parameter_counts()
    return {**c, "ratio %": round(100.0 * c["trainable"] / c["total"], 2)}


def fit_action_head(
    policy, batch: Mapping[str, Any], steps: int, lr: float = 3e-3, seed: int = 0, repeats: int = 8
) -> list[float]:
    """A few optimiser steps on one batch with the backbone frozen (the smoke test's setup):
    enough for the head to say something about this batch, not training. Returns the losses
    and leaves the backbone frozen.

    A frozen backbone gives the same context every step, so it is computed once and
    ``policy.loss`` (the real objective) reuses it; only the head runs in the loop."""
    import torch

    from tutorial_utils.train.prepare import apply_freeze

    apply_freeze(policy, ["backbone"])
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        ctx, pad = policy.encode(batch)
    context = (ctx.repeat(repeats, 1, 1), pad.repeat(repeats, 1))
    labels = {"action": np.tile(np.asarray(batch["action"], np.float32), (repeats, 1, 1))}
    if batch.get("action_is_pad") is not None:
        labels["action_is_pad"] = np.tile(np.asarray(batch["action_is_pad"]), (repeats, 1))
    policy.encode = lambda _batch: context  # instance attribute: shadows the method
    policy.train()
    losses = []
    try:
        for _ in range(int(steps)):
            loss = policy.loss(labels, gen)["total_loss"]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        del policy.encode
        policy.eval()
    return losses


def euler_path(policy, batch: Mapping[str, Any], steps: int | None = None, seed: int = 0):
    """Follow ``policy.sample``'s Euler integration and keep every intermediate chunk.

    Returns ``(ts, xs)``: ``ts`` the flow times [1, ..., 0] (steps + 1 values) and ``xs`` an
    array (steps + 1, B, horizon, action_dim) of normalised chunks, ``xs[0]`` the noise and
    ``xs[-1]`` what ``policy.sample`` returns for the same seed."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    steps = int(steps or policy.cfg.num_inference_steps)
    with torch.no_grad():
        ctx, pad = policy.encode(batch)
        B = ctx.shape[0]
        x = torch.randn(B, policy.cfg.action_horizon, policy.cfg.action_dim, generator=gen).to(ctx.device)
        dt = 1.0 / steps
        ts, xs = [1.0], [x.cpu().numpy()]
        for i in range(steps):
            t = torch.full((B,), 1.0 - i * dt, device=ctx.device)
            x = x - dt * policy.action_model(x, t, ctx, pad)
            ts.append(round(1.0 - (i + 1) * dt, 6))
            xs.append(x.cpu().numpy())
    return np.asarray(ts), np.stack(xs)


def time_scales(
    fps: float = 20.0, horizon: int = 8, denoise_steps: int = 4, executed: Mapping[str, int] | None = None
) -> list[dict]:
    """The three clocks of a DiT4DiT rollout, with numbers, one row per clock."""
    executed = dict(executed or {"DiT4DiT": horizon, "openpi": 5})
    dt_ms = 1000.0 / fps
    rows = [
        {
            "clock": "video flow time (backbone)",
            "unit": "video denoising step",
            "per policy call": "1 forward pass, hidden states of block 17 at the first (noisiest) step of the video schedule",
            "numbers": "training also samples video times for future_video_loss on frames 2, 4, 6, 8",
        },
        {
            "clock": "action flow time t (head)",
            "unit": "Euler step",
            "per policy call": f"{denoise_steps} head passes, t = "
            + ", ".join(f"{1 - i / denoise_steps:g}" for i in range(denoise_steps))
            + " -> 0",
            "numbers": f"dt = {1 / denoise_steps:g}; training draws t ~ Beta(1.5, 1)",
        },
    ]
    for who, n in executed.items():
        rows.append(
            {
                "clock": f"robot control time ({who})",
                "unit": f"control step ({dt_ms:g} ms at {fps:g} fps)",
                "per policy call": f"{n} of the {horizon} actions executed, then a new call",
                "numbers": f"one call every {n * dt_ms:g} ms = {fps / n:g} calls per simulated second",
            }
        )
    return rows


def plot_euler_path(
    ts: np.ndarray,
    xs: np.ndarray,
    target: np.ndarray | None = None,
    sample: int = 0,
    names: Sequence[str] = ACTION_NAMES,
    fps: float = 20.0,
):
    """One panel per action dimension: the chunk at each Euler step (light = noise at t=1,
    dark = the action at t=0) over the chunk's control steps; ``target`` dashed if given."""
    import matplotlib.pyplot as plt

    dims = xs.shape[-1]
    cols = min(4, dims)
    rows = -(-dims // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.3 * rows), sharex=True, squeeze=False)
    horizon = xs.shape[2]
    steps_ms = np.arange(horizon) * 1000.0 / fps
    cmap = plt.get_cmap("viridis")
    for d in range(rows * cols):
        ax = axes.flat[d]
        if d >= dims:
            ax.axis("off")
            continue
        for k, t in enumerate(ts):
            ax.plot(
                steps_ms,
                xs[k, sample, :, d],
                marker="o",
                ms=2.5,
                lw=1.2,
                color=cmap(0.9 * (1 - k / max(1, len(ts) - 1))),
                alpha=0.5 + 0.5 * k / max(1, len(ts) - 1),
                label=f"t = {t:g}",
            )
        if target is not None:
            ax.plot(steps_ms, target[sample, :, d], ls="--", color="crimson", lw=1.4, label="demo chunk")
        ax.set_title(names[d] if d < len(names) else f"dim {d}", fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("control time in the chunk (ms)")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower right", bbox_to_anchor=(0.98, 0.05), fontsize=9, frameon=False)
    fig.suptitle("One action chunk along the 4 Euler steps (normalised units)", fontsize=11)
    fig.tight_layout()
    return fig
