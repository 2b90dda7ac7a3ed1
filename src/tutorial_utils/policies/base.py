"""The policy seam: what every policy family implements, for serving and for training.

Two interfaces, one per direction of use:

:class:`Policy` (serving). ``infer(obs) -> {"actions": (H, 7) float32}`` on one observation in
the openpi LIBERO keys (``observation/image``, ``observation/wrist_image`` (HxWx3 uint8,
already flipped 180 degrees), ``observation/state`` (8,), ``prompt``; plus ``privileged`` when
its metadata asks for it). Its ``metadata`` (sent to every client on connect) tells the
evaluation client how to drive it:

=====================  ==========================================================================
``policy``             the registry name
``image_size``         square input size the client resizes to (``None``: any size)
``action_horizon``     H, the chunk length
``replan_steps``       how many actions of each chunk the client executes before asking again
``gripper``            ``"robosuite"`` (-1 open, +1 close) or ``"dataset"`` (1 open, -1 close)
``needs_privileged``   the client adds ``privileged`` (simulator state) to the observation
``n_obs_steps``        observation frames the policy sees (trained models; > 1: it keeps the
                       episode's history, and our client sends every frame, see ``ServedModel``)
=====================  ==========================================================================

:class:`~tutorial_utils.policies.trainable.TrainablePolicy` (training, in ``trainable.py``). A torch module built from a typed config (a dataclass
declared with :func:`tutorial_utils.params.param`) and the dataset's statistics. It takes
batches in LeRobot's key names (:data:`BATCH_KEYS`), so a LeRobot policy plugs in without a
translation layer: ``loss(batch) -> {"total_loss": ..., ...}``, ``predict(batch) -> (B, H, 7)``
actions in robot units, ``save(dir)`` / ``load(dir)`` (safetensors + ``config.json`` +
``dataset_statistics.json``, see :mod:`tutorial_utils.policies.checkpoint`), and
:meth:`~tutorial_utils.policies.trainable.TrainablePolicy.serving_policy`, the adapter that makes it a :class:`Policy`.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

from tutorial_utils.errors import TutorialError

# --- the observation a served policy receives (openpi's LIBERO keys) -----------------------------
IMAGE_KEY = "observation/image"
WRIST_KEY = "observation/wrist_image"
STATE_KEY = "observation/state"
PROMPT_KEY = "prompt"
PRIVILEGED_KEY = "privileged"
OPENPI_KEYS = (IMAGE_KEY, WRIST_KEY, STATE_KEY, PROMPT_KEY)
STATE_DIM = 8

# --- the batch a trainable policy receives (LeRobot's key names) ---------------------------------
BATCH_IMAGE = "observation.images.image"
BATCH_WRIST = "observation.images.wrist_image"
BATCH_STATE = "observation.state"
BATCH_ACTION = "action"
BATCH_ACTION_IS_PAD = "action_is_pad"
BATCH_TASK = "task"
BATCH_CAMERAS = (BATCH_IMAGE, BATCH_WRIST)
BATCH_KEYS = (BATCH_IMAGE, BATCH_WRIST, BATCH_STATE, BATCH_ACTION, BATCH_ACTION_IS_PAD, BATCH_TASK)
#: LeRobot's padding mask of a key read at several offsets (``observation.state_is_pad``: (T,) bool)
PAD_SUFFIX = "_is_pad"
#: an optional request key: the episode this observation belongs to. A served policy that keeps
#: observation history (``n_obs_steps`` > 1) starts a new history when it changes; our LIBERO
#: client sends a fresh one per episode (openpi's client signals episodes with a control frame
#: instead: see ``PolicyServer._control`` and ``ServedModel``)
EPISODE_KEY = "episode_id"
#: an optional request key: record this observation in the history, predict nothing (the reply's
#: chunk is empty). Our client sends the frames between two predictions this way, so the history
#: a policy sees is one environment step apart, as in its training windows
OBSERVE_ONLY_KEY = "observe_only"
#: the one mapping between the two: openpi's request key -> the LeRobot batch key it becomes
#: (:func:`observation_to_batch` reads it one way, :func:`batch_to_observation` the other)
OPENPI_TO_BATCH = {IMAGE_KEY: BATCH_IMAGE, WRIST_KEY: BATCH_WRIST, STATE_KEY: BATCH_STATE, PROMPT_KEY: BATCH_TASK}


class PolicyUnavailable(TutorialError, RuntimeError):
    """The policy cannot be built here (unknown name, missing checkout or checkpoint)."""


class CheckpointError(TutorialError, RuntimeError):
    """A checkpoint directory is missing, corrupted or from a different model config."""


class Policy(abc.ABC):
    """``infer(obs) -> {"actions": (H, 7) float32}``, ``metadata``, ``reset()``."""

    name = "policy"

    @property
    def metadata(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "image_size": 224,
            "action_horizon": 1,
            "replan_steps": 1,
            "gripper": "robosuite",
            "needs_privileged": False,
        }

    @abc.abstractmethod
    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        """One observation -> ``{"actions": (H, 7) float32, ...}``."""

    def reset(self) -> None:  # noqa: B027 - an optional hook, a no-op unless a policy keeps episode state
        """Forget any per-episode state."""


class ZeroPolicy(Policy):
    """Holds still with the gripper open: a stand-in for wiring tests and the live demo."""

    name = "zero"

    def __init__(self, horizon: int = 8, image_size: int | None = 224):
        self.horizon = horizon
        self.image_size = image_size

    @property
    def metadata(self) -> dict[str, Any]:
        return {
            **super().metadata,
            "image_size": self.image_size,
            "action_horizon": self.horizon,
            "replan_steps": self.horizon,
        }

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        actions = np.zeros((self.horizon, 7), np.float32)
        actions[:, 6] = -1.0
        return {"actions": actions}


def make_zero(checkpoint: str | None = None, **kw: Any) -> Policy:
    return ZeroPolicy(**kw)


class ObservationError(TutorialError, ValueError):
    """A served observation a policy cannot use: a missing key, images that are not (H, W, 3)
    uint8, a state that is not numbers or holds NaN/inf. The message names the key."""


def observation_to_batch(obs: Mapping[str, Any]) -> dict[str, Any]:
    """One served observation (openpi keys) -> a batch of one in LeRobot's key names.

    Refuses (:class:`ObservationError`, naming the key) what would otherwise come back as NaN
    actions or a cast that silently wraps: a missing key, images that are not (H, W, 3) uint8,
    a state that is not numeric or not finite.
    """
    import numpy as np

    if not isinstance(obs, Mapping):
        raise ObservationError(f"an observation must be a map of {', '.join(OPENPI_KEYS)}, got {type(obs).__name__}")
    missing = [k for k in (IMAGE_KEY, WRIST_KEY, STATE_KEY) if k not in obs]
    if missing:
        raise ObservationError(
            f"observation has no {', '.join(missing)}: send the openpi LIBERO keys {', '.join(OPENPI_KEYS)}"
        )
    images = {}
    for key in (IMAGE_KEY, WRIST_KEY):
        img = np.asarray(obs[key])
        if img.dtype != np.uint8:
            raise ObservationError(
                f"{key}: images must be uint8 (0..255), got dtype {img.dtype}. Send the camera frame as "
                "uint8, e.g. np.clip(img * 255, 0, 255).astype(np.uint8) for a float image in 0..1"
            )
        if img.ndim != 3 or img.shape[-1] != 3:
            raise ObservationError(f"{key}: images must be (H, W, 3) uint8, got shape {tuple(img.shape)}")
        images[key] = img
    raw = np.asarray(obs[STATE_KEY])
    if raw.dtype.kind not in "biuf":
        raise ObservationError(
            f"{STATE_KEY}: the state must be {STATE_DIM} numbers (eef position, axis-angle, gripper "
            f"qpos), got dtype {raw.dtype}"
        )
    state = raw.astype(np.float32).reshape(1, -1)
    if not np.isfinite(state).all():
        where = np.flatnonzero(~np.isfinite(state[0])).tolist()
        raise ObservationError(
            f"{STATE_KEY}: the state holds NaN or inf at index {where} ({state[0].tolist()}). A policy would "
            "return NaN actions: check the robot state the client reads (a sensor that is not ready, a "
            "division by zero in the axis-angle conversion)"
        )
    values = {
        **{k: img[None] for k, img in images.items()},
        STATE_KEY: state,
        PROMPT_KEY: [str(obs.get(PROMPT_KEY, ""))],
    }
    return {OPENPI_TO_BATCH[k]: v for k, v in values.items()}


def batch_to_observation(batch: Mapping[str, Any], i: int = 0) -> dict[str, Any]:
    """Item ``i`` of a batch in LeRobot key names as an openpi LIBERO request (what
    :class:`tutorial_utils.serve.client.PolicyClient` sends): uint8 images, a float32 state, a str
    prompt. A missing key is an :class:`ObservationError` naming it."""
    import numpy as np

    missing = [b for b in OPENPI_TO_BATCH.values() if b not in batch]
    if missing:
        raise ObservationError(f"the batch has no {', '.join(missing)}; pass a batch in LeRobot key names.")
    out: dict[str, Any] = {}
    for key, b in OPENPI_TO_BATCH.items():
        item = batch[b]
        if key == PROMPT_KEY:
            out[key] = str(item[i] if isinstance(item, (list, tuple)) else item)
        elif key == STATE_KEY:
            out[key] = np.asarray(item[i], dtype=np.float32)
        else:
            out[key] = np.ascontiguousarray(np.asarray(item[i], dtype=np.uint8))
    return out
