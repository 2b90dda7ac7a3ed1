"""The LIBERO schema of the LeRobot datasets: cameras, state and action names, fps, and the
gripper conventions (dataset: +1 open / -1 close; robosuite: -1 open / +1 close)."""

from __future__ import annotations

import json

import numpy as np

from tutorial_utils.data.schema import DEFAULT_FEATURES

# LIBERO as published in IPEC-COMMUNITY/libero_*_no_noops_1.0.0_lerobot (converted with
# any4lerobot from the OpenVLA "no_noops" RLDS): LIBERO's control frequency is 20 Hz,
# cameras are 256x256, state is eef position (3) + axis-angle (3) + two gripper finger
# positions, action is a 6-D delta pose + gripper command. The published info.json also
# carries observation.states.{ee_state,joint_state,gripper_state}; DiT4DiT's modality.json
# never reads them, so this schema leaves them out (the reader accepts extra features).
LIBERO_FPS = 20
LIBERO_ROBOT_TYPE = "franka"
LIBERO_IMAGE_SIZE = 256
LIBERO_CAMERAS = ("observation.images.image", "observation.images.wrist_image")
LIBERO_STATE_NAMES = ["x", "y", "z", "roll", "pitch", "yaw", "gripper", "gripper"]
LIBERO_ACTION_NAMES = ["x", "y", "z", "roll", "pitch", "yaw", "gripper"]
LIBERO_STATE_DIM = 8
LIBERO_ACTION_DIM = 7
#: The range of every action number robosuite's env.step takes (OSC_POSE deltas and the gripper
#: command): values outside it mean nothing to LIBERO, and a real robot may not clip them.
LIBERO_ACTION_LOW = -1.0
LIBERO_ACTION_HIGH = 1.0

#: What each dimension means in the LIBERO datasets (docs/FACTS.md sections 5 and 9). Gripper
#: convention of the published datasets: +1 = open, -1 = close (robosuite wants the opposite).
LIBERO_DIM_MEANING = {
    "observation.state": [
        "end-effector x, world frame (m)",
        "end-effector y, world frame (m)",
        "end-effector z, world frame (m)",
        "end-effector orientation, axis-angle x (rad)",
        "end-effector orientation, axis-angle y (rad)",
        "end-effector orientation, axis-angle z (rad)",
        "left finger position (m, ~0.04 open)",
        "right finger position (m, ~-0.04 open)",
    ],
    "action": [
        "delta x (1.0 = 5 cm)",
        "delta y (1.0 = 5 cm)",
        "delta z (1.0 = 5 cm)",
        "delta rotation x (1.0 = 0.5 rad)",
        "delta rotation y (1.0 = 0.5 rad)",
        "delta rotation z (1.0 = 0.5 rad)",
        "gripper command (+1 open, -1 close in the dataset)",
    ],
}


# --- the gripper conventions: the one conversion ---------------------------------------------------
#
# The 7th action number (index 6) commands the gripper, with two opposite conventions:
#
# - ``"dataset"``: the LIBERO LeRobot datasets (IPEC's and our recordings), so every policy
#   trained on them: ``+1`` open, ``-1`` close;
# - ``"robosuite"``: what LIBERO's env.step (robosuite) wants, and what openpi's LIBERO example
#   sends unmodified: ``-1`` open, ``+1`` close.
#
# A policy's metadata["gripper"] names the convention of its actions. The policy server answers
# openpi-shaped requests in the robosuite convention (it converts a "dataset" policy's chunk with
# :func:`dataset_action_to_env`); recording stores the expert's robosuite actions with
# :func:`env_action_to_dataset`. Nothing else in the package flips a gripper.

#: The gripper convention of the LIBERO datasets and the policies trained on them.
DATASET_GRIPPER = "dataset"
#: The gripper convention of robosuite's env.step.
ROBOSUITE_GRIPPER = "robosuite"
GRIPPER_CONVENTIONS = (ROBOSUITE_GRIPPER, DATASET_GRIPPER)


def _float_copy(action) -> np.ndarray:
    a = np.asarray(action)
    return a.astype(a.dtype if a.dtype.kind == "f" else np.float64, copy=True)


def dataset_action_to_env(action) -> np.ndarray:
    """Dataset / policy actions (gripper +1 open / -1 close) -> robosuite actions (-1 open / +1 close).

    ``action`` is one action ``(7,)`` or a chunk ``(..., 7)``; a float copy (same float dtype) is
    returned with the gripper flipped and binarised as in openpi's and OpenVLA's LIBERO clients:
    ``-1`` (open) where the policy said > 0, else ``+1`` (close). The pose numbers are untouched.
    """
    a = _float_copy(action)
    a[..., 6] = np.where(a[..., 6] > 0, -1.0, 1.0)
    return a


def env_action_to_dataset(action) -> np.ndarray:
    """robosuite actions (gripper -1 open / +1 close) -> dataset actions (+1 open / -1 close), float32.

    Used by recording; the expert's gripper commands are already -1 / +1, so this is a sign flip.
    """
    a = np.asarray(action, dtype=np.float32).copy()
    a[..., 6] = -a[..., 6]
    return a


def action_to_env(action, gripper: str) -> np.ndarray:
    """Actions in the ``gripper`` convention (``"robosuite"`` or ``"dataset"``) -> robosuite's."""
    if gripper == DATASET_GRIPPER:
        return dataset_action_to_env(action)
    if gripper == ROBOSUITE_GRIPPER:
        return _float_copy(action)
    raise ValueError(
        f"unknown gripper convention {gripper!r} (metadata['gripper'] of the policy / server): use "
        f"{ROBOSUITE_GRIPPER!r} (-1 open, +1 close) or {DATASET_GRIPPER!r} (+1 open, -1 close)"
    )


def libero_features(image_size: int = LIBERO_IMAGE_SIZE) -> dict:
    """The ``features`` block of the LIBERO LeRobot datasets (cameras ``image_size`` square).

    Includes the five default columns, in the published order.
    """
    if int(image_size) <= 0 or int(image_size) % 2:
        raise ValueError(f"image_size must be a positive even number (h264 yuv420p), got {image_size}")
    s = int(image_size)
    video = {"dtype": "video", "shape": [s, s, 3], "names": ["height", "width", "rgb"]}
    feats: dict[str, dict] = {
        LIBERO_CAMERAS[0]: json.loads(json.dumps(video)),
        LIBERO_CAMERAS[1]: json.loads(json.dumps(video)),
        "observation.state": {
            "dtype": "float32",
            "shape": [LIBERO_STATE_DIM],
            "names": {"motors": list(LIBERO_STATE_NAMES)},
        },
        "action": {"dtype": "float32", "shape": [LIBERO_ACTION_DIM], "names": {"motors": list(LIBERO_ACTION_NAMES)}},
    }
    feats.update(json.loads(json.dumps(DEFAULT_FEATURES)))
    return feats


# --- no-op actions (the ``no_noops`` datasets' rule, for recording and for imports) ------------------

#: arm motion below this norm (``|a[:6]|``) counts as none
NOOP_THRESHOLD = 1e-4


def noop_mask(actions: np.ndarray, threshold: float = NOOP_THRESHOLD) -> np.ndarray:
    """True where an action is a no-op as in the ``no_noops`` datasets: no arm motion and the
    gripper command unchanged from the previous action (the first one: motion alone decides)."""
    a = np.asarray(actions, dtype=np.float64)
    still = np.linalg.norm(a[:, :6], axis=1) < threshold
    same = np.ones(len(a), dtype=bool)
    same[1:] = a[1:, 6] == a[:-1, 6]
    return still & same


def is_noop(action: np.ndarray, prev_action: np.ndarray | None, threshold: float = NOOP_THRESHOLD) -> bool:
    """:func:`noop_mask` for one action given the previous one (``None`` for the first)."""
    pair = [action] if prev_action is None else [prev_action, action]
    return bool(noop_mask(np.asarray(pair, dtype=np.float64).reshape(len(pair), -1), threshold)[-1])
