"""DiT4DiT's LIBERO wire profile: what upstream's client sends and does with the reply
(docs/FACTS.md section 11, "Upstream client wire shape"; upstream ``examples/LIBERO/eval_files``).

Request, built by :func:`build_request` (our client, ``EvalConfig(protocol="dit4dit")``)::

    {"examples": [{"image": [primary || wrist], "lang": str, "state": (1, 16) float32}],
     "do_sample": False, "use_ddim": True, "num_ddim_steps": 10}

- each camera comes in rotated 180 degrees (our env's :meth:`images` already flips, as robosuite
  renders upside down) and is resized to 224x224 with area interpolation
  (:func:`tutorial_utils.data.images.resize_area`, OpenCV's ``INTER_AREA`` in numpy); primary and
  wrist sit side by side: one (224, 448, 3) uint8 image in a one-element list;
- the 8-D state (eef pos 3 + axis-angle 3 + gripper qpos 2) becomes INTERLEAVED sin/cos per
  dimension (sin s0, cos s0, sin s1, cos s1, ...), zero-padded to 16: shape (1, 16);
- upstream's client also leaves its un-resized ``wrist_image`` in the example; upstream's server
  never reads it, so we do not send those 196 KB.

Reply (upstream ``websocket_policy_server.py``): ``{"status": "ok", "ok": True, "type":
"inference_result", "request_id": ..., "data": {"normalized_actions": (1, 8, 8)}}``. The client
(:meth:`ActionStatistics.to_env`) keeps the first 7 dims of each of the 8 actions, clips them to
[-1, 1], sets the gripper to 1 where it is >= 0.5 else 0, un-normalises
``0.5 * (a + 1) * (max - min) + min`` where the statistics' ``mask`` is true, then turns the
gripper into robosuite's ``1 - 2 * (g > 0.5)`` (-1 open, +1 close); it executes the whole chunk
before the next request. The statistics are the checkpoint's ``dataset_statistics.json``
(``{"<embodiment>": {"action": {"min", "max", "mask", ...}, ...}}``; upstream reads it at
``<pt>.parents[1]``).

Our server (:class:`tutorial_utils.serve.server.PolicyServer`) answers the same shape, always
:data:`CHUNK` (8) actions as upstream's server does, whatever the served policy's chunk (ACT's 16 are
cut to their first 8, a shorter chunk is padded by repeating its last action:
:class:`tutorial_utils.serve.protocol.ActionGuard`, which also clips them to [-1, 1]): the served
policy's actions normalised by the same formula inverted (:meth:`ActionStatistics.normalize`), the
gripper as +1 (open) / -1 (close), so our client's un-normalisation gives back the policy's own
actions. The server decodes the state with ``atan2(sin, cos)``: angles come back modulo 2 pi, in
(-pi, pi].
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tutorial_utils.policies.normalize import STATS_FILE, StatisticsError
from tutorial_utils.serve.protocol import DIT4DIT_ACTION_DIM as ACTION_DIM
from tutorial_utils.serve.protocol import DIT4DIT_CHUNK as CHUNK
from tutorial_utils.serve.protocol import DIT4DIT_IMAGE_SIZE as IMAGE_SIZE
from tutorial_utils.serve.protocol import DIT4DIT_REQUEST_OPTIONS as REQUEST_OPTIONS
from tutorial_utils.serve.protocol import DIT4DIT_STATE_DIM as STATE_DIM
from tutorial_utils.serve.protocol import build_dit4dit_request as build_request
from tutorial_utils.serve.protocol import decode_state, encode_state, side_by_side
from tutorial_utils.serve.protocol import dit4dit_reply as pad_reply
from tutorial_utils.serve.protocol import dit4dit_reply_chunk as reply_chunk

__all__ = [
    "ACTION_DIM",
    "CHUNK",
    "IMAGE_SIZE",
    "REQUEST_OPTIONS",
    "STATE_DIM",
    "ActionStatistics",
    "build_request",
    "client_statistics",
    "decode_state",
    "encode_state",
    "pad_reply",
    "reply_chunk",
    "server_statistics",
    "side_by_side",
    "statistics_path_for",
]

#: the env's action: dx dy dz droll dpitch dyaw gripper
ENV_ACTION_DIM = 7
GRIPPER = 6
#: where the client turns the normalised gripper into 0 / 1 (upstream ``unnormalize_actions``)
GRIPPER_THRESHOLD = 0.5
#: the embodiment block our datasets write (and DiT4DiT's LIBERO checkpoints carry)
EMBODIMENT = "franka"
#: the key under which our server announces the statistics it normalises with
METADATA_KEY = "dit4dit_statistics"


# --- statistics ----------------------------------------------------------------------------------


def statistics_path_for(checkpoint: str | os.PathLike) -> Path:
    """Where a checkpoint's statistics live: ``<pt>.parents[1]/dataset_statistics.json`` for an
    upstream ``.pt`` file (upstream's ``read_mode_config``), ``<dir>/dataset_statistics.json`` for
    one of our checkpoint directories."""
    ck = Path(checkpoint)
    if ck.suffix == ".pt":
        return ck.parents[1] / STATS_FILE
    return ck / STATS_FILE


def _vector(block: Mapping, name: str, where: str, source: str, dtype=np.float64) -> np.ndarray:
    if name not in block:
        raise StatisticsError(
            f"{source}: key '{where}.{name}' is missing (found {sorted(block)}). The file is the checkpoint's "
            f"dataset_statistics.json (upstream: two levels above the .pt; ours: in the checkpoint directory)."
        )
    try:
        v = np.asarray(block[name], dtype=dtype).reshape(-1)
    except (TypeError, ValueError):
        raise StatisticsError(
            f"{source}: key '{where}.{name}' must be a list of {'booleans' if dtype is bool else 'numbers'}, "
            f"found {block[name]!r:.80}. Recompute it (`python -m tutorial_utils dataset stats DIR --run-dir RUN`)."
        ) from None
    if dtype is not bool and not np.isfinite(v).all():
        raise StatisticsError(f"{source}: key '{where}.{name}' has NaN or inf values; recompute the statistics.")
    return v


@dataclass(frozen=True)
class ActionStatistics:
    """The action min / max / mask of one ``dataset_statistics.json`` block (7 env dims).

    ``normalize`` (server) and ``unnormalize`` / ``to_env`` (client) are each other's inverse on
    actions inside [min, max] where the mask is true and inside [-1, 1] where it is false."""

    min: np.ndarray
    max: np.ndarray
    mask: np.ndarray
    source: str = STATS_FILE
    key: str = EMBODIMENT

    @classmethod
    def from_mapping(cls, stats: Any, source: str = STATS_FILE, key: str | None = None) -> ActionStatistics:
        """Pick the block (``key``, else the only one, else ``franka``) and check its ``action``."""
        if not isinstance(stats, Mapping) or not stats:
            raise StatisticsError(
                f"{source}: expected a map {{embodiment: {{'action': {{'min', 'max', 'mask'}}}}}}, found "
                f"{type(stats).__name__ if not isinstance(stats, Mapping) else 'an empty map'}. Use the "
                f"dataset_statistics.json the checkpoint was trained with."
            )
        if key is None:
            if len(stats) == 1:
                key = next(iter(stats))
            elif EMBODIMENT in stats:
                key = EMBODIMENT
            else:
                raise StatisticsError(
                    f"{source}: {len(stats)} blocks ({', '.join(map(str, stats))}) and none is {EMBODIMENT!r}; keep "
                    f"only the block of the embodiment you evaluate in a copy of the file and pass that copy."
                )
        block = stats.get(key)
        if not isinstance(block, Mapping) or not isinstance(block.get("action"), Mapping):
            raise StatisticsError(
                f"{source}: key '{key}.action' is missing or not a map (found keys "
                f"{sorted(block) if isinstance(block, Mapping) else type(block).__name__}). Use the checkpoint's "
                f"dataset_statistics.json."
            )
        act, where = block["action"], f"{key}.action"
        low, high = _vector(act, "min", where, source), _vector(act, "max", where, source)
        mask = _vector(act, "mask", where, source, bool) if "mask" in act else np.ones_like(low, dtype=bool)
        if not (low.shape == high.shape == mask.shape) or low.shape[0] < ENV_ACTION_DIM:
            raise StatisticsError(
                f"{source}: '{where}.min', '.max' and '.mask' must have one length >= {ENV_ACTION_DIM} "
                f"(dx dy dz droll dpitch dyaw gripper), found {low.shape[0]}, {high.shape[0]}, {mask.shape[0]}."
            )
        if (high < low).any():
            bad = int(np.nonzero(high < low)[0][0])
            raise StatisticsError(
                f"{source}: '{where}.max'[{bad}] = {high[bad]} is below '{where}.min'[{bad}] = {low[bad]}; "
                f"the file is damaged: recompute it."
            )
        n = ENV_ACTION_DIM
        return cls(low[:n].copy(), high[:n].copy(), mask[:n].copy(), source, str(key))

    @classmethod
    def from_file(cls, path: str | os.PathLike, key: str | None = None) -> ActionStatistics:
        path = Path(path)
        if not path.is_file():
            raise StatisticsError(
                f"{path} not found: protocol=dit4dit un-normalises actions with the checkpoint's "
                f"dataset_statistics.json. Pass its path as `statistics` (upstream: next to config.yaml, two "
                f"levels above the .pt file; ours: inside the checkpoint directory)."
            )
        try:
            stats = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise StatisticsError(
                f"{path} is not valid JSON ({exc}); copy the checkpoint's dataset_statistics.json again."
            ) from None
        return cls.from_mapping(stats, str(path), key)

    @classmethod
    def action_space(cls) -> ActionStatistics:
        """LIBERO's action space itself (min -1, max +1 on the six motion dims, gripper raw): the
        statistics of a served policy that has none (the expert, a zero policy); normalising
        with them changes nothing."""
        low = -np.ones(ENV_ACTION_DIM)
        return cls(low, -low, np.arange(ENV_ACTION_DIM) != GRIPPER, "the action space [-1, 1]", EMBODIMENT)

    def to_dict(self) -> dict[str, Any]:
        """The block as our server announces it in its metadata (``dit4dit_statistics``)."""
        return {"key": self.key, "min": self.min.tolist(), "max": self.max.tolist(), "mask": self.mask.tolist()}

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> ActionStatistics:
        d = meta[METADATA_KEY]
        return cls.from_mapping({d.get("key", EMBODIMENT): {"action": d}}, "the server's metadata")

    # server side
    def normalize(self, actions, gripper: str = "dataset") -> np.ndarray:
        """(chunk, 7) actions in the policy's ``gripper`` convention -> normalised (chunk, 7):
        ``2 * (a - min) / (max - min) - 1`` where the mask is true (``-1`` where max == min), raw
        elsewhere; the gripper +1 when open, -1 when closed."""
        from tutorial_utils.data.libero_schema import action_to_env

        a = np.asarray(actions, dtype=np.float64).reshape(-1, ENV_ACTION_DIM)
        span = self.max - self.min
        safe = np.where(span > 0, span, 1.0)
        n = np.where(self.mask, np.where(span > 0, 2.0 * (a - self.min) / safe - 1.0, -1.0), a)
        n[:, GRIPPER] = np.where(action_to_env(a, gripper)[:, GRIPPER] < 0, 1.0, -1.0)  # robosuite: < 0 is open
        return n.astype(np.float32)

    # client side (upstream's order)
    def unnormalize(self, normalized) -> np.ndarray:
        """Normalised (chunk, >= 7) -> (chunk, 7) robot units with the gripper 0 / 1 (1 open), as
        upstream's client: clip to [-1, 1], gripper to 1 where >= 0.5 else 0, then
        ``0.5 * (a + 1) * (max - min) + min`` where the mask is true."""
        n = np.clip(np.asarray(normalized, dtype=np.float64)[:, :ENV_ACTION_DIM], -1.0, 1.0)
        n[:, GRIPPER] = np.where(n[:, GRIPPER] < GRIPPER_THRESHOLD, 0.0, 1.0)
        return np.where(self.mask, 0.5 * (n + 1.0) * (self.max - self.min) + self.min, n)

    def to_env(self, normalized) -> np.ndarray:
        """Normalised (chunk, >= 7) -> robosuite actions (chunk, 7): :meth:`unnormalize`, then the
        gripper ``1 - 2 * (g > 0.5)`` (-1 open, +1 close)."""
        a = self.unnormalize(normalized)
        a[:, GRIPPER] = 1.0 - 2.0 * (a[:, GRIPPER] > GRIPPER_THRESHOLD)
        return a


def client_statistics(
    statistics: str | os.PathLike = "", checkpoint: str | os.PathLike = "", metadata: Mapping | None = None
) -> ActionStatistics:
    """The statistics our client un-normalises with: the ``statistics`` file when given, else the
    checkpoint's (:func:`statistics_path_for`), else what our own server announced in its
    metadata (``dit4dit_statistics``; upstream's server announces none)."""
    if statistics:
        return ActionStatistics.from_file(statistics)
    if checkpoint:
        return ActionStatistics.from_file(statistics_path_for(checkpoint))
    if metadata and METADATA_KEY in metadata:
        return ActionStatistics.from_metadata(metadata)
    raise StatisticsError(
        "protocol=dit4dit needs the checkpoint's dataset_statistics.json to un-normalise the actions, and "
        "neither `statistics` nor `checkpoint` is set (and the server announced none). Set statistics="
        "<run_dir>/dataset_statistics.json (upstream: two levels above the .pt file)."
    )


def server_statistics(policy, statistics: Any = None) -> ActionStatistics:
    """The statistics our server normalises a ``dit4dit`` reply with: ``statistics`` (a path or a
    ``dataset_statistics.json`` map) when given, else the served checkpoint's (a served model's
    ``model.statistics``), else the action space's (:meth:`ActionStatistics.action_space`)."""
    if statistics is not None and not isinstance(statistics, Mapping):
        return ActionStatistics.from_file(statistics)
    if statistics is None:
        statistics = getattr(getattr(policy, "model", None), "statistics", None) or getattr(policy, "statistics", None)
    if not statistics:
        return ActionStatistics.action_space()
    return ActionStatistics.from_mapping(statistics, "the served checkpoint's dataset_statistics.json")
