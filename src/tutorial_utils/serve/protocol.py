"""A websocket policy server and client in the openpi framing (FACTS.md section 4).

The wire protocol, which openpi's ``openpi-client`` and DiT4DiT's ``server_policy.py`` share:

- websockets with ``compression=None``. openpi's server sets ``max_size=None``; ours refuses a
  frame over ``max_frame_bytes`` (default :data:`DEFAULT_MAX_FRAME_BYTES`, 16 MiB; ``serve
  --max-frame-mb``) before buffering it, closing the connection with code 1009 (message too big).
  An openpi LIBERO request (two 224x224x3 uint8 images, the state and the prompt) is ~0.3 MB, so
  the default leaves 50x headroom. Clients accept replies of any size (``max_size=None``);
- on connect the server sends one binary frame: the policy's metadata;
- then request / reply, each a msgpack binary frame. numpy arrays travel as maps
  ``{"__ndarray__": True, "data": <raw bytes>, "dtype": "<f4", "shape": [..]}`` and numpy
  scalars as ``{"__npgeneric__": True, "data": <item>, "dtype": ".."}`` (the map keys are
  msgpack *bin* strings, as openpi writes them; we read str keys too);
- a reply carries ``server_timing`` (``infer_ms``, and ``prev_total_ms`` from the second
  request on);
- a *text* frame from the server is an error, and the client raises it. Ours carries only
  ``ErrorType: message`` (no traceback, file paths shortened to their last part); a server
  started with ``debug=True`` (``serve --debug``) sends the full traceback, as openpi's does. The
  server's log always has the full traceback. Our server then keeps serving the same connection;
- ``GET /healthz`` answers ``OK``.

Two request shapes are understood (see :func:`to_policy_observation`):

- openpi LIBERO: ``observation/image``, ``observation/wrist_image`` (HxWx3 uint8),
  ``observation/state`` (8,), ``prompt``; reply ``actions`` (chunk x 7) in robosuite's gripper
  convention (-1 open, +1 close), so openpi's ``examples/libero/main.py`` passes them straight
  to ``env.step``: the server converts a ``"dataset"``-convention policy's chunk and announces
  ``gripper: "robosuite"`` (the policy's own convention under ``policy_gripper``);
- DiT4DiT: ``{"examples": [{"image": [primary||wrist], "lang": str, "state": (1, 16)}]}``;
  reply ``{"data": {"normalized_actions": (1, chunk, 8)}}`` in the policy's own convention
  (``policy_gripper``), as DiT4DiT's client expects.

Images of any size are accepted and resized to the policy's ``image_size`` with the package's
one resize, :func:`tutorial_utils.data.images.resize` (the one training windows use).

CLI: ``python -m tutorial_utils serve --policy expert --port 8000``."""

from __future__ import annotations

from typing import Any

from tutorial_utils.errors import TutorialError
from tutorial_utils.policies.base import (
    IMAGE_KEY,
    OPENPI_KEYS,
    PRIVILEGED_KEY,
    PROMPT_KEY,
    STATE_DIM,
    STATE_KEY,
    WRIST_KEY,
)
from tutorial_utils.policies.base import ObservationError as PolicyObservationError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
HEALTH_PATH = "/healthz"
#: The largest frame the server reads (``PolicyServer(max_frame_bytes=...)``, ``serve --max-frame-mb``):
#: 16 MiB, ~50x an openpi LIBERO request (2 x 224x224x3 uint8 images + state + prompt, ~0.3 MB).
DEFAULT_MAX_FRAME_BYTES = 16 * 2**20


# --- errors --------------------------------------------------------------------------------------


class ServingError(TutorialError, RuntimeError):
    """Base class of the serving errors."""


class ObservationError(ServingError, PolicyObservationError):
    """A request the policy cannot use (missing key, wrong shape or dtype): the serving side of
    :class:`tutorial_utils.policies.base.ObservationError`, so one ``except`` catches both."""


class ServerError(ServingError):
    """The server answered with a text frame: ``ErrorType: message``, or the whole traceback from a
    server started with ``--debug`` (and from openpi's). ``server_message`` is the last line,
    ``server_traceback`` the traceback (None when the server sent none)."""

    def __init__(self, text: str):
        text = text.strip()
        last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), text)
        has_tb = "Traceback (most recent call last)" in text
        self.server_message = last if has_tb else text
        self.server_traceback = text if has_tb else None
        if has_tb:
            super().__init__(f"policy server error: {last}\n--- server traceback ---\n{text}")
        else:
            super().__init__(f"policy server error: {text}")


class ServerUnavailable(ServingError, TimeoutError):
    """No server answered within the connect timeout."""


class ServerDied(ServingError, ConnectionError):
    """The connection closed or timed out in the middle of a request."""


class PortInUse(ServingError, OSError):
    """The port is taken by another process."""


# --- request adapters ----------------------------------------------------------------------------


def _as_image(value: Any, key: str, size: int | None):
    """An HxWx3 uint8 image of any size -> ``size`` x ``size`` (the policy's metadata['image_size'])
    through the package's one resize (:func:`tutorial_utils.data.images.resize`), so a policy sees
    the pixels it was trained on whatever the client sends (openpi's LIBERO example sends 224)."""
    import numpy as np

    from tutorial_utils.data.images import resize

    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError):  # ragged lists, ...
        raise ObservationError(
            f"request key {key!r}: expected an image (H, W, 3) uint8 array, found a {type(value).__name__} "
            f"numpy cannot read as an array."
        ) from None
    if arr.ndim != 3 or arr.shape[-1] != 3:
        raise ObservationError(
            f"request key {key!r}: expected an image of shape (H, W, 3), found shape {tuple(arr.shape)}. "
            f"Send HxWx3 uint8 RGB (channels last)."
        )
    if arr.dtype != np.uint8:
        raise ObservationError(
            f"request key {key!r}: expected dtype uint8, found {arr.dtype}. Send 0..255 uint8 pixels."
        )
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ObservationError(
            f"request key {key!r}: the image is empty, shape {tuple(arr.shape)}. Send HxWx3 uint8 RGB."
        )
    if size is not None and arr.shape[:2] != (size, size) and not arr.flags.writeable:
        arr = arr.copy()  # msgpack arrays are read-only views; torch.from_numpy warns on those
    return resize(arr, size)


def _as_state(value: Any, key: str):
    import numpy as np

    expected = f"Send {STATE_DIM} finite numbers, e.g. a float32 array of shape ({STATE_DIM},)."
    arr = None
    if not isinstance(value, (str, bytes, bytearray, dict)):
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError, OverflowError):  # ragged lists, ...
            arr = None
    if arr is None or arr.dtype.kind not in "biuf":
        found = type(value).__name__ if arr is None else f"{type(value).__name__} of dtype {arr.dtype}"
        raise ObservationError(f"request key {key!r}: expected numbers, found a {found}. {expected}")
    arr = arr.astype(np.float64).reshape(-1)
    if not np.isfinite(arr).all():
        raise ObservationError(
            f"request key {key!r}: the state must be finite, found {int((~np.isfinite(arr)).sum())} NaN/inf "
            f"value(s). {expected}"
        )
    if arr.shape[0] == 2 * STATE_DIM:  # DiT4DiT's sin/cos encoded state: sin(s) then cos(s)
        arr = np.arctan2(arr[:STATE_DIM], arr[STATE_DIM:])
    if arr.shape[0] != STATE_DIM:
        raise ObservationError(
            f"request key {key!r}: expected {STATE_DIM} numbers (eef pos 3 + axis-angle 3 + gripper qpos 2), "
            f"found {arr.shape[0]}."
        )
    return arr.astype(np.float32)


def detect_protocol(request: Any) -> str:
    """``"dit4dit"`` for an ``examples`` request, else ``"openpi"``."""
    if isinstance(request, dict) and "examples" in request:
        return "dit4dit"
    return "openpi"


def to_policy_observation(request: Any, image_size: int | None = None) -> dict[str, Any]:
    """A request in either protocol -> the policy observation (openpi LIBERO keys).

    Raises :class:`ObservationError` naming the key when something is missing or malformed.
    """
    if not isinstance(request, dict):
        raise ObservationError(
            f"request must be a map (dict) of observation keys, found {type(request).__name__}. "
            f"Expected keys: {', '.join(OPENPI_KEYS)}."
        )
    if "examples" in request:
        ex = request["examples"]
        if not isinstance(ex, (list, tuple)) or not ex or not isinstance(ex[0], dict):
            raise ObservationError(
                "request key 'examples': expected a non-empty list of maps with 'image', 'lang', 'state'."
            )
        ex = ex[0]
        missing = [k for k in ("image", "lang", "state") if k not in ex]
        if missing:
            raise ObservationError(
                f"request key 'examples[0]': missing {', '.join(map(repr, missing))}; expected 'image', 'lang', 'state'."
            )
        images = ex["image"]
        images = list(images) if isinstance(images, (list, tuple)) else [images]
        if not images:
            raise ObservationError(
                "request key 'examples[0].image': the list is empty; send [primary || wrist] side by side, "
                "or [primary, wrist]."
            )
        if len(images) == 1:  # primary || wrist side by side
            both = _as_image(images[0], "examples[0].image", None)
            h, w = both.shape[:2]
            if w != 2 * h:
                raise ObservationError(
                    f"request key 'examples[0].image': expected primary and wrist side by side (H, 2H, 3), found {both.shape}."
                )
            images = [both[:, :h], both[:, h:]]
        obs = {
            IMAGE_KEY: _as_image(images[0], "examples[0].image[0]", image_size),
            WRIST_KEY: _as_image(images[1], "examples[0].image[1]", image_size),
            STATE_KEY: _as_state(ex["state"], "examples[0].state"),
            PROMPT_KEY: str(ex["lang"]),
        }
        if PRIVILEGED_KEY in ex or PRIVILEGED_KEY in request:
            obs[PRIVILEGED_KEY] = ex.get(PRIVILEGED_KEY, request.get(PRIVILEGED_KEY))
        return obs
    missing = [k for k in OPENPI_KEYS if k not in request]
    if missing:
        raise ObservationError(
            f"request is missing key(s) {', '.join(map(repr, missing))}; found {', '.join(map(repr, request)) or 'none'}. "
            f"An openpi LIBERO request has {', '.join(OPENPI_KEYS)}."
        )
    obs = dict(request)
    obs[IMAGE_KEY] = _as_image(request[IMAGE_KEY], IMAGE_KEY, image_size)
    obs[WRIST_KEY] = _as_image(request[WRIST_KEY], WRIST_KEY, image_size)
    obs[STATE_KEY] = _as_state(request[STATE_KEY], STATE_KEY)
    if not isinstance(request[PROMPT_KEY], str):
        raise ObservationError(
            f"request key {PROMPT_KEY!r}: expected a string (the task language), found {type(request[PROMPT_KEY]).__name__}."
        )
    return obs


def to_reply(result: dict[str, Any], protocol: str) -> dict[str, Any]:
    """The policy's result -> the reply for ``protocol``.

    For ``dit4dit`` the chunk is padded to 8 action dims under ``data.normalized_actions``; the
    server normalises it first when the policy has ``normalize_actions`` (else the actions are
    in robot units, which this package's own client expects).
    """
    import numpy as np

    actions = np.asarray(result["actions"], dtype=np.float32)
    if actions.ndim == 1:
        actions = actions[None]
    if protocol == "dit4dit":
        padded = np.zeros((1, actions.shape[0], 8), np.float32)
        padded[0, :, : actions.shape[1]] = actions
        extra = {k: v for k, v in result.items() if k != "actions"}
        return {"data": {"normalized_actions": padded, **extra}}
    return {**result, "actions": actions}


def to_request(obs: dict[str, Any], protocol: str = "openpi") -> dict[str, Any]:
    """Client side: openpi-keyed observation -> a request for ``protocol``."""
    import numpy as np

    if protocol == "openpi":
        return obs
    if protocol == "dit4dit":
        both = np.concatenate([obs[IMAGE_KEY], obs[WRIST_KEY]], axis=1)
        s = np.asarray(obs[STATE_KEY], dtype=np.float32).reshape(-1)
        ex = {"image": [both], "lang": obs[PROMPT_KEY], "state": np.concatenate([np.sin(s), np.cos(s)])[None]}
        if PRIVILEGED_KEY in obs:
            ex[PRIVILEGED_KEY] = obs[PRIVILEGED_KEY]
        return {"examples": [ex]}
    raise ValueError(f"unknown protocol {protocol!r}; use 'openpi' or 'dit4dit'")


def reply_actions(reply: dict[str, Any]):
    """The (chunk, 7) float32 actions of a reply in either protocol."""
    import numpy as np

    if "actions" in reply:
        a = np.asarray(reply["actions"], dtype=np.float32)
    elif isinstance(reply.get("data"), dict) and "normalized_actions" in reply["data"]:
        a = np.asarray(reply["data"]["normalized_actions"], dtype=np.float32)[0, :, :7]
    else:
        raise ServingError(f"reply has neither 'actions' nor 'data.normalized_actions'; keys: {sorted(reply)}")
    return a.reshape(-1, 7) if a.ndim == 1 else a


# --- server --------------------------------------------------------------------------------------
