"""A websocket policy server and client in the openpi framing (docs/FACTS.md section 4).

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
- an openpi reply carries ``server_timing`` (``infer_ms``, and ``prev_total_ms`` from the second
  request on); a DiT4DiT reply keeps upstream's keys only;
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
  ``gripper: "robosuite"`` (the policy's own convention under ``policy_gripper``). The actions are
  clipped to the env's range [-1, 1] (``clipped_values`` counts the reply's clipped numbers) and the
  chunk holds at least 5 actions (openpi's ``replan_steps``; a shorter one is padded by repeating its
  last action): :class:`ActionGuard`;
- DiT4DiT (upstream's LIBERO client, :mod:`tutorial_utils.serve.dit4dit_profile`):
  ``{"examples": [{"image": [primary || wrist (224, 448, 3)], "lang": str, "state": (1, 16)}],
  "do_sample": False, "use_ddim": True, "num_ddim_steps": 10}``, the state interleaved sin/cos
  (sin s0, cos s0, ...) zero-padded to 16; reply upstream's ``{"status": "ok", "ok": True, "type":
  "inference_result", "request_id": .., "data": {"normalized_actions": (1, 8, 8)}}`` (always 8
  actions, as upstream: a longer chunk is cut, a shorter one padded): the
  policy's actions normalised to [-1, 1] with the served checkpoint's min / max (gripper +1 open,
  -1 close), which the client un-normalises with the same ``dataset_statistics.json``.

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


# --- the DiT4DiT wire shape (upstream's LIBERO client; tutorial_utils.serve.dit4dit_profile) -------

#: each camera's side in a DiT4DiT request (upstream ``Args.resize_size``)
DIT4DIT_IMAGE_SIZE = 224
#: the encoded state's width (``framework.action_model.state_dim`` in upstream's config.yaml)
DIT4DIT_STATE_DIM = 16
#: actions per reply (``future_action_window_size + 1``) and their padded width
DIT4DIT_CHUNK = 8
DIT4DIT_ACTION_DIM = 8
#: upstream's client sends these beside ``examples``; its server passes them to ``predict_action``
DIT4DIT_REQUEST_OPTIONS = {"do_sample": False, "use_ddim": True, "num_ddim_steps": 10}


def side_by_side(primary, wrist, size: int = DIT4DIT_IMAGE_SIZE):
    """Two (H, W, 3) uint8 cameras -> one (size, 2*size, 3) image: each area-resized
    (:func:`tutorial_utils.data.images.resize_area`, OpenCV's ``INTER_AREA``), primary left."""
    import numpy as np

    from tutorial_utils.data.images import resize_area

    return np.concatenate([resize_area(primary, size), resize_area(wrist, size)], axis=1)


def encode_state(state, state_dim: int = DIT4DIT_STATE_DIM):
    """(D,) state -> (1, state_dim) float32: sin s0, cos s0, sin s1, cos s1, ..., then zeros."""
    import numpy as np

    s = np.asarray(state, dtype=np.float32).reshape(-1)
    if 2 * s.shape[0] > state_dim:
        raise ValueError(f"a {s.shape[0]}-D state needs {2 * s.shape[0]} sin/cos slots, state_dim is {state_dim}")
    enc = np.stack([np.sin(s), np.cos(s)], axis=-1).reshape(1, -1)
    return np.pad(enc, ((0, 0), (0, state_dim - enc.shape[1]))).astype(np.float32)


def decode_state(encoded, key: str = "examples[0].state", dim: int = STATE_DIM):
    """Server side: the interleaved sin/cos state -> (dim,) float32 angles ``atan2(sin, cos)``
    (modulo 2 pi, in (-pi, pi]). Raises :class:`ObservationError` naming ``key``."""
    import numpy as np

    arr = np.asarray(encoded, dtype=np.float64).reshape(-1)
    if arr.shape[0] < 2 * dim:
        raise ObservationError(
            f"request key {key!r}: expected the {dim}-D state as interleaved sin/cos padded to "
            f"{DIT4DIT_STATE_DIM} numbers, shape (1, {DIT4DIT_STATE_DIM}); found {arr.shape[0]} numbers."
        )
    pairs = arr[: 2 * dim].reshape(dim, 2)
    return np.arctan2(pairs[:, 0], pairs[:, 1]).astype(np.float32)


def build_dit4dit_request(primary, wrist, state, lang: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The request upstream's LIBERO client sends, from two already-rotated camera images (any
    size), the 8-D state and the task language. ``extra`` entries go into the example (our
    expert's ``privileged`` observation; upstream's server ignores unknown keys). Upstream's client
    also leaves its un-resized ``wrist_image`` in the example, which its server never reads: we
    do not send it."""
    example = {"image": [side_by_side(primary, wrist)], "lang": str(lang), "state": encode_state(state)}
    example.update(extra or {})
    return {"examples": [example], **DIT4DIT_REQUEST_OPTIONS}


def dit4dit_reply(normalized, request_id: Any = "default") -> dict[str, Any]:
    """(chunk, d) normalised actions -> upstream's reply (``websocket_policy_server.py``), the
    actions padded to (1, chunk, 8) under ``data.normalized_actions``."""
    import numpy as np

    a = np.asarray(normalized, dtype=np.float32)
    padded = np.zeros((1, a.shape[0], max(DIT4DIT_ACTION_DIM, a.shape[1])), np.float32)
    padded[0, :, : a.shape[1]] = a
    return {
        "status": "ok",
        "ok": True,
        "type": "inference_result",
        "request_id": request_id,
        "data": {"normalized_actions": padded},
    }


def dit4dit_reply_chunk(reply: Any):
    """``data.normalized_actions`` of a reply -> (chunk, dims) float32 (the first batch element).

    An upstream error reply (``status: "error"``: its policy raised) becomes :class:`ServerError`;
    a reply without the key a :class:`ServingError` naming what it had."""
    import numpy as np

    if isinstance(reply, dict) and reply.get("status") == "error":
        err = reply.get("error")
        msg = err.get("message") if isinstance(err, dict) else err
        raise ServerError(f"the DiT4DiT server's policy failed: {msg}")
    data = reply.get("data") if isinstance(reply, dict) else None
    if not isinstance(data, dict) or "normalized_actions" not in data:
        keys = sorted(reply) if isinstance(reply, dict) else type(reply).__name__
        raise ServingError(
            f"a DiT4DiT reply carries data.normalized_actions (1, {DIT4DIT_CHUNK}, {DIT4DIT_ACTION_DIM}); this "
            f"one has {keys}. Is the server an openpi one? Then evaluate with protocol=openpi."
        )
    a = np.asarray(data["normalized_actions"], dtype=np.float32)
    if a.ndim == 3:
        a = a[0]
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 7:
        raise ServingError(
            f"data.normalized_actions has shape {a.shape}; expected (1, chunk, >= 7), upstream sends "
            f"(1, {DIT4DIT_CHUNK}, {DIT4DIT_ACTION_DIM})"
        )
    return a


# --- what every chunk goes through before it is answered: the env's range and the client's length ---

#: openpi's LIBERO loop (``examples/libero/main.py``) executes ``replan_steps`` actions of each chunk
#: (default 5) and asserts the chunk holds at least that many (docs/FACTS.md section 14)
OPENPI_REPLAN_STEPS = 5


def fit_chunk(actions, length: int):
    """(H, d) -> (length, d): the first ``length`` actions, a shorter chunk padded by repeating its
    last action. Returns ``(chunk, how)`` with ``how`` ``"padded"``, ``"cut"`` or ``""``."""
    import numpy as np

    a = np.asarray(actions)
    if a.shape[0] == length:
        return a, ""
    if a.shape[0] > length:
        return a[:length], "cut"
    return np.concatenate([a, np.repeat(a[-1:], length - a.shape[0], axis=0)]), "padded"


class ActionGuard:
    """What the server does to every chunk before it answers, so any client gets actions it can use.

    - **The env's range.** Every number is clipped to LIBERO's action range (``[low, high]``, [-1, 1]:
      :data:`tutorial_utils.data.libero_schema.LIBERO_ACTION_LOW`), because openpi's LIBERO client
      passes the actions to ``env.step`` (a robot) unclipped. A policy emitting out-of-range values
      stays visible: each clipped number is counted (:attr:`clipped_values`, :attr:`clipped_replies`,
      :attr:`largest`), openpi replies carry the reply's count under ``clipped_values``, and the log
      says so (the first three clipped replies, then the 10th, 100th, 1000th...).
    - **The client's chunk length.** openpi: at least ``min_chunk`` actions (openpi's LIBERO loop
      asserts ``len(chunk) >= replan_steps``, default 5): a shorter chunk (SAC's one action) is padded by
      repeating its last action. DiT4DiT: at most :data:`DIT4DIT_CHUNK` (8, what upstream's server always
      sends; its client executes the whole chunk): a longer one (ACT's 16) is cut to its first 8. A
      shorter one goes out as it is: padding it would make the client execute a repeated action open
      loop (the scripted expert, one action a step, then misses its grasp). Each change
      is counted (:attr:`padded_replies`, :attr:`cut_replies`), announced in the metadata
      (:meth:`metadata`) and logged once per protocol.
    """

    def __init__(
        self,
        action_horizon: int | None = None,
        replan_steps: int | None = None,
        min_chunk: int = OPENPI_REPLAN_STEPS,
        low: float | None = None,
        high: float | None = None,
        log=None,
    ):
        import logging

        from tutorial_utils.data.libero_schema import LIBERO_ACTION_HIGH, LIBERO_ACTION_LOW

        if isinstance(min_chunk, bool) or not isinstance(min_chunk, int) or min_chunk < 0:
            from tutorial_utils.errors import ConfigError

            raise ConfigError(
                f"min_chunk must be a whole number >= 0 (serve --min-chunk), found {min_chunk!r}: openpi's LIBERO "
                f"loop needs chunks of at least its replan_steps ({OPENPI_REPLAN_STEPS}); 0 sends the policy's own"
            )
        self.horizon = int(action_horizon) if action_horizon else None
        self.replan_steps = int(replan_steps) if replan_steps else None
        self.min_chunk = min_chunk
        self.low = LIBERO_ACTION_LOW if low is None else float(low)
        self.high = LIBERO_ACTION_HIGH if high is None else float(high)
        self.log = log or logging.getLogger("tutorial_utils.serve")
        self.replies = self.clipped_values = self.clipped_replies = 0
        self.padded_replies = self.cut_replies = 0
        self.largest = 0.0  # the largest |value| clipped so far
        self.last_clipped = 0
        self._told: set[str] = set()

    @classmethod
    def for_policy(cls, metadata: dict, min_chunk: int = OPENPI_REPLAN_STEPS, log=None) -> ActionGuard:
        """A guard for the policy whose metadata the server serves."""
        return cls(metadata.get("action_horizon"), metadata.get("replan_steps"), min_chunk, log=log)

    def metadata(self) -> dict[str, Any]:
        """What the server adds to the metadata it announces: the range it clips to and, for a
        policy whose chunk is shorter than ``min_chunk``, how openpi replies are padded."""
        meta: dict[str, Any] = {"action_range": [self.low, self.high], "openpi_min_chunk": self.min_chunk}
        if self.horizon and self.horizon < self.min_chunk:
            meta["chunk_padding"] = self._padding_text("openpi", self.horizon, self.min_chunk)
        return meta

    def _padding_text(self, protocol: str, got: int, length: int) -> str:
        if protocol == "dit4dit":
            why = f"upstream's DiT4DiT client executes all {length} actions of a reply"
        else:
            why = f"openpi's LIBERO loop asserts a chunk of at least its replan_steps, default {OPENPI_REPLAN_STEPS}"
        text = (
            f"the policy returns {got} action(s) per chunk; {protocol} replies are padded to {length} by repeating "
            f"its last action ({why}). A client that executes the whole reply repeats that action"
        )
        if self.replan_steps:
            text += f"; one that follows metadata['replan_steps'] ({self.replan_steps}) executes only the policy's own"
        return text

    def __call__(self, actions, protocol: str = "openpi"):
        """(H, 7) actions -> the chunk to answer with: clipped to the range, fitted to ``protocol``'s length."""
        import numpy as np

        a = np.asarray(actions, dtype=np.float32)
        if a.ndim == 1:
            a = a[None]
        out = np.clip(a, self.low, self.high)
        outside = (a < self.low) | (a > self.high)
        n = int(outside.sum())
        self.replies += 1
        self.last_clipped = n
        if n:
            self.clipped_values += n
            self.clipped_replies += 1
            big = float(np.abs(a[outside]).max())
            self.largest = max(self.largest, big)
            k = self.clipped_replies
            if k <= 3 or (k >= 10 and str(k).rstrip("0") == "1"):  # the first 3, then the 10th, 100th, ...
                dims = sorted({int(d) for d in np.nonzero(outside)[1]})
                self.log.warning(
                    f"clipped {n} of {a.size} action values to [{self.low:g}, {self.high:g}] (largest |value| "
                    f"{big:.4g}, action dims {dims}); so far {self.clipped_values} values in {k} of {self.replies} "
                    "replies. The policy emits actions outside the env's range: check its training and statistics"
                )
        length = min(DIT4DIT_CHUNK, out.shape[0]) if protocol == "dit4dit" else max(self.min_chunk, out.shape[0])
        out, how = fit_chunk(out, length)
        if how == "padded":
            self.padded_replies += 1
        elif how == "cut":
            self.cut_replies += 1
        if how and protocol + how not in self._told:
            self._told.add(protocol + how)
            if how == "padded":
                self.log.info(self._padding_text(protocol, a.shape[0], length))
            else:
                self.log.info(
                    f"the policy returns {a.shape[0]} actions per chunk; {protocol} replies carry its first "
                    f"{length} (upstream's DiT4DiT server always sends {DIT4DIT_CHUNK}, and its client executes them all)"
                )
        return out.astype(np.float32)

    def summary(self) -> str:
        """One line for the server's log when it stops."""
        text = (
            f"actions: {self.clipped_values} value(s) clipped to [{self.low:g}, {self.high:g}] in "
            f"{self.clipped_replies} of {self.replies} replies"
        )
        if self.clipped_values:
            text += f" (largest |value| {self.largest:.4g})"
        return text + f"; {self.padded_replies} chunk(s) padded, {self.cut_replies} cut"


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


def _as_state(value: Any, key: str, sincos: bool = False):
    """The 8-D state; with ``sincos`` (DiT4DiT) also the interleaved sin/cos encoding padded to 16."""
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
    if sincos and arr.shape[0] != STATE_DIM:  # DiT4DiT: sin s0, cos s0, sin s1, ... padded to 16
        arr = decode_state(arr, key, STATE_DIM)
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
            STATE_KEY: _as_state(ex["state"], "examples[0].state", sincos=True),
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


def to_reply(result: dict[str, Any], protocol: str, request_id: Any = "default") -> dict[str, Any]:
    """The policy's result -> the reply for ``protocol``.

    For ``dit4dit``, ``result["actions"]`` must already be normalised (the server does it with
    :meth:`tutorial_utils.serve.dit4dit_profile.ActionStatistics.normalize`): the reply is
    upstream's shape, the chunk padded to 8 dims under ``data.normalized_actions`` (1, chunk, 8),
    with ``request_id`` echoed (upstream's default ``"default"``). Other result keys are dropped.
    """
    import numpy as np

    actions = np.asarray(result["actions"], dtype=np.float32)
    if actions.ndim == 1:
        actions = actions[None]
    if protocol == "dit4dit":
        return dit4dit_reply(actions, request_id)
    return {**result, "actions": actions}


def to_request(obs: dict[str, Any], protocol: str = "openpi") -> dict[str, Any]:
    """Client side: openpi-keyed observation -> a request for ``protocol``.

    ``dit4dit``: upstream's LIBERO request (:func:`build_dit4dit_request`):
    both cameras (already rotated 180 degrees, any size) area-resized to 224 and side by side, the
    state interleaved sin/cos padded to 16; a ``privileged`` entry rides in the example."""
    if protocol == "openpi":
        return obs
    if protocol == "dit4dit":
        extra = {PRIVILEGED_KEY: obs[PRIVILEGED_KEY]} if PRIVILEGED_KEY in obs else None
        return build_dit4dit_request(obs[IMAGE_KEY], obs[WRIST_KEY], obs[STATE_KEY], obs[PROMPT_KEY], extra)
    raise ValueError(f"unknown protocol {protocol!r}; use 'openpi' or 'dit4dit'")


def reply_actions(reply: dict[str, Any]):
    """The (chunk, 7) float32 actions of a reply in either protocol, as sent: for DiT4DiT the first
    7 dims of ``data.normalized_actions``, still normalised (un-normalise them with
    :meth:`tutorial_utils.serve.dit4dit_profile.ActionStatistics.to_env`)."""
    import numpy as np

    if "actions" in reply:
        a = np.asarray(reply["actions"], dtype=np.float32)
    elif "data" in reply or reply.get("status") == "error":
        a = dit4dit_reply_chunk(reply)[:, :7]
    else:
        raise ServingError(f"reply has neither 'actions' nor 'data.normalized_actions'; keys: {sorted(reply)}")
    return a.reshape(-1, 7) if a.ndim == 1 else a


# --- server --------------------------------------------------------------------------------------
