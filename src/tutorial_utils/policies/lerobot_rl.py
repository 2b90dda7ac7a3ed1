"""LeRobot 0.4.4's reinforcement-learning families, TD-MPC and SAC, fed from recorded demonstrations.

**What has run, exactly** (:data:`TDMPC_WHAT_RAN`, :data:`SAC_WHAT_RAN`). ``tests/test_policies_lerobot_rl.py``
runs 2 optimisation steps of each on a 24-frame synthetic source (3 episodes of 8 frames, 48 px),
saves, reloads and serves the result. TD-MPC has also been trained offline by the project's trainer
on one libero_spatial task's recorded demonstrations and evaluated in LIBERO, in chapter 9's positive
control (``logs/positive_control_tdmpc_cpu.json``). SAC has not: it has never been trained on the
recorded demonstrations nor evaluated in LIBERO, and no SAC success rate exists in this book.

What the code does:

- **TD-MPC** (``tdmpc``, LeRobot's FOWM-style TD-MPC, ``lerobot.policies.tdmpc``) learns *offline*
  from demonstration windows with a sparse success reward: reward ``success_reward`` on the last
  frame of a successful episode, 0 elsewhere (the recorder writes only successful episodes, so every
  episode ends in a success). Its loss needs what the other families do not: the observations of the
  ``horizon`` frames after the current one, the rewards and their padding masks. Those windows come
  from :class:`DemonstrationWindows` (any training source: the v2.1 reader or arrays). The project's
  trainer trains it: ``python -m tutorial_utils train policy=tdmpc`` wraps its source with
  :meth:`TDMPCPolicy.training_source` and its ``collate`` keeps the extra keys; :func:`offline_steps`
  is the same optimisation in a loop of your own. Served, it plans with LeRobot's MPPI/CEM
  (``use_mpc``) over the learned latent model, from scratch on each request (no warm start across
  calls); :meth:`TDMPCPolicy.select_action` is LeRobot's own closed-loop call with its action queue.
  Never trained online, so its value estimates would only ever see the expert's actions. LeRobot's
  advantage-weighted policy loss reads detached latents, so imitation never trains the encoder;
  ``bc_coeff`` adds a behaviour-cloning term whose gradients reach it.
- **SAC** (``sac``, ``lerobot.policies.sac``) is built and *updated* from the demonstrations'
  transitions ``(s, a, r, s', done)`` with the same sparse reward (:meth:`SACPolicy.update`: the
  critic step, then the actor and temperature steps, then the target critics' soft update, each with
  its own optimiser, as LeRobot's learner does; :func:`offline_steps`). That proves the update; it is
  not how SAC learns a LIBERO task. The project's trainer does not train it (one loss, one optimiser):
  ``train policy=sac`` stops before it starts with :data:`SAC_WHAT_RAN` and where to go. Online
  training in LIBERO needs what LeRobot's actor/learner pair provides (``lerobot.rl``: ``python -m
  lerobot.rl.learner`` + ``python -m lerobot.rl.actor``): an environment loop that steps LIBERO with
  the actor's actions, a replay buffer that stores the transitions (optionally seeded with these
  demonstrations as the offline buffer), a reward (the environment's success signal, or a learned
  reward classifier), and many environment steps (LeRobot's default ``online_steps`` is 1,000,000).

Checkpoints, serving and evaluation are the seam's, as for every family.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from tutorial_utils.errors import ConfigError
from tutorial_utils.params import param
from tutorial_utils.policies.base import (
    BATCH_ACTION,
    BATCH_ACTION_IS_PAD,
    BATCH_CAMERAS,
    BATCH_STATE,
    BATCH_TASK,
    ObservationError,
    PolicyUnavailable,
    observation_to_batch,
)
from tutorial_utils.policies.lerobot import CAMERA_NAMES, LeRobotPolicy

#: What has run of each family, quoted by the trainer's refusal and the zoo's messages.
TDMPC_WHAT_RAN = (
    "TD-MPC has run here as a smoke test (2 optimisation steps on a 24-frame synthetic source, then a save, "
    "reload and served chunk) and twice for real: trained offline by the project's trainer on one libero_spatial "
    "task's recorded demonstrations, with the sparse reward of the step where LIBERO's goal predicate became "
    "true, and evaluated in LIBERO like every other family (chapter 9's positive control, "
    "logs/positive_control_tdmpc_cpu.json: its plans succeeded in no episode); then with bc_coeff 1.0, an "
    "imitation term that trains the encoder, its policy head served alone (use_mpc off) and evaluated on the "
    "same episodes (logs/tdmpc_bc_eval_results.json), a behaviour-cloning result, not a planning one. It has "
    "not been trained online"
)
SAC_WHAT_RAN = (
    "SAC has run here only as a smoke test: 2 update steps (SACPolicy.update: critic, actor, temperature) on a "
    "24-frame synthetic source, then a save, reload and served action. It has never been trained on the recorded "
    "demonstrations, never run online in LIBERO, never evaluated, so no SAC success rate exists in this book"
)

#: the extra keys of a demonstration window (LeRobot's names, the observation windows prefixed)
WINDOW = "window."
STATE_IS_PAD = "observation.state_is_pad"
REWARD = "next.reward"
REWARD_IS_PAD = "next.reward_is_pad"
DONE = "next.done"
INDEX = "index"


def conv_encoder_side(image_size: int) -> int:
    """The side of the feature map LeRobot's TD-MPC / SAC image encoder leaves (four valid
    convolutions: kernel 7, 5, 3, 3, stride 2 each)."""
    side = int(image_size)
    for k in (7, 5, 3, 3):
        side = (side - k) // 2 + 1
    return side


def _check_image_size(family: str, size: int) -> None:
    if conv_encoder_side(size) < 1:
        raise ConfigError(
            f"image_size={size} is too small for {family}: LeRobot's encoder (four stride-2 convolutions, kernels "
            "7, 5, 3, 3) needs at least 40 px. Use image_size >= 40 (64 on a CPU)."
        )


# --- windows of demonstrations ----------------------------------------------------------------------


class DemonstrationWindows:
    """Windows ``t .. t+horizon`` of a training source, with the sparse success reward.

    ``source`` is any training source (``train.data.LeRobotSource`` or ``ArraySource``): it needs
    ``get(i, horizon)`` (one frame, in LeRobot's key names), ``frame_episode`` and ``statistics``.
    Item ``t`` holds what every family's window holds (the current frame's cameras (S, S, 3) uint8
    and ``observation.state`` (8,), ``action`` (``horizon``, 7), ``action_is_pad``, ``task``), so the
    trainer's validation and the served ``predict`` read it as usual, plus:

    - ``window.<camera>`` (``horizon+1``, S, S, 3) uint8, ``window.observation.state``
      (``horizon+1``, 8) and ``observation.state_is_pad`` (frames past the episode's end repeat its
      last frame, padded);
    - ``next.reward`` (``horizon``,): ``success_reward`` for the action taken on the last frame of a
      successful episode, else 0; ``next.reward_is_pad``; ``next.done`` (1 on that last frame);
    - ``index`` (t).

    It is itself a training source (``get(i, horizon)``, ``frame_episode``, ``statistics``): a trainer
    whose collate passes the extra keys through can train TD-MPC on it unchanged.

    ``successful``: the episode indices that ended in success (default: all, which is what the
    recorder writes: ``sim/record.py`` keeps only successful episodes).
    """

    def __init__(
        self,
        source: Any,
        horizon: int,
        image_size: int,
        success_reward: float = 1.0,
        successful: Sequence[int] | None = None,
    ):
        from tutorial_utils.data.images import resize

        if horizon < 1:
            raise ConfigError(f"horizon={horizon} must be >= 1 (the frames after the current one)")
        self.source, self.horizon, self.image_size = source, int(horizon), int(image_size)
        self.success_reward = float(success_reward)
        self._resize = resize
        ep = np.asarray(source.frame_episode, np.int64)
        if ep.ndim != 1 or len(ep) != len(source):
            raise ConfigError(f"source {getattr(source, 'name', '')!r}: frame_episode must give one episode per frame")
        self.frame_episode = ep
        self.ep_end = np.zeros(len(ep), np.int64)
        for e in np.unique(ep):
            idx = np.nonzero(ep == e)[0]
            self.ep_end[idx] = idx.max() + 1
        ok = set(np.unique(ep).tolist()) if successful is None else {int(e) for e in successful}
        self.successful = np.array([int(e) in ok for e in ep], bool)
        self.statistics = getattr(source, "statistics", {})
        self.name = getattr(source, "name", "windows")

    def __len__(self) -> int:
        return len(self.frame_episode)

    def get(self, t: int, horizon: int | None = None, image_size: int | None = None) -> dict:
        """The window at frame ``t``, its images at the family's ``image_size`` (whatever the caller's)."""
        h = self.horizon if horizon is None else int(horizon)
        end = int(self.ep_end[t])
        frames = [self.source.get(min(t + k, end - 1), 1, image_size=self.image_size) for k in range(h + 1)]
        valid = np.array([t + k < end for k in range(h + 1)], bool)
        out: dict[str, Any] = {}
        for cam in BATCH_CAMERAS:
            out[WINDOW + cam] = np.stack([self._resize(f[cam], self.image_size) for f in frames])
            out[cam] = out[WINDOW + cam][0]
        out[WINDOW + BATCH_STATE] = np.stack([np.asarray(f[BATCH_STATE], np.float32) for f in frames])
        out[BATCH_STATE] = out[WINDOW + BATCH_STATE][0]
        out[STATE_IS_PAD] = ~valid
        out[BATCH_ACTION] = np.stack([np.asarray(f[BATCH_ACTION], np.float32)[0] for f in frames[:h]])
        act_valid = valid[:h]
        out[BATCH_ACTION_IS_PAD] = ~act_valid
        last = np.array([t + k == end - 1 for k in range(h)], bool)
        out[DONE] = last.astype(np.float32)
        out[REWARD] = np.where(last & bool(self.successful[t]), self.success_reward, 0.0).astype(np.float32)
        out[REWARD_IS_PAD] = ~act_valid
        out[INDEX] = np.int64(t)
        out[BATCH_TASK] = frames[0][BATCH_TASK]
        return out

    def batch(self, indices: Sequence[int]) -> dict:
        """The windows of ``indices`` stacked into torch tensors (``task``: a list of strings)."""
        items = [self.get(int(i)) for i in indices]
        out: dict[str, Any] = {BATCH_TASK: [it[BATCH_TASK] for it in items]}
        for k in items[0]:
            if k != BATCH_TASK:
                out[k] = torch.from_numpy(np.stack([np.asarray(it[k]) for it in items]))
        return out


def _needs_windows(model: LeRobotPolicy, batch: Mapping[str, Any], frames: int) -> None:
    key = WINDOW + BATCH_STATE
    shape = tuple(getattr(batch.get(key), "shape", ()))
    if len(shape) != 3 or shape[1] < frames or REWARD not in batch:
        raise PolicyUnavailable(
            f"policy {model.name!r} learns from windows of {frames} frames with rewards ({key} (B, {frames}, 8) "
            f"and {REWARD}); this batch has {key if key in batch else 'no ' + key}"
            f"{' of shape ' + str(shape) if key in batch else ''} and {'a' if REWARD in batch else 'no'} {REWARD}. "
            + (
                "Feed it windows: "
                if getattr(model, "trainer_refusal", "")
                else "Feed it windows: the project's trainer does (`python -m tutorial_utils train "
                f"policy={model.name}` wraps its data with model.training_source); in your own loop "
            )
            + "use `offline_steps(model, model.training_source(source), steps=...)` from "
            "tutorial_utils.policies.lerobot_rl."
        )


def _float_images(x: Any) -> torch.Tensor:
    """(..., S, S, 3) uint8 -> (..., 3, S, S) float in [0, 1]; float channel-first images pass through."""
    x = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
    if x.dtype == torch.uint8:
        return x.movedim(-1, -3).float() / 255.0
    return x.float()


class _ClosedLoop:
    """LeRobot's own closed-loop call (``select_action`` with its action queue) on one served observation."""

    def reset(self) -> None:
        """Forget the queued actions (call at the start of each episode, as LeRobot's ``env.reset()`` does)."""
        self.policy.reset()

    @torch.no_grad()
    def select_action(self, obs: Mapping[str, Any]) -> np.ndarray:
        """One action (7,) in robot units for one observation in the openpi LIBERO keys."""
        was_training = self.training
        self.eval()
        try:
            lb = self._lerobot_batch(observation_to_batch(obs), with_action=False)
            action = self.policy.select_action(self._observation(lb))
            _pre, post = self.processors()
            return post(action)[0].detach().float().cpu().numpy().astype(np.float32)
        finally:
            self.train(was_training)

    def _observation(self, lb: Mapping[str, Any]) -> dict:
        keys = {self.lerobot_key(c) for c in self.cameras} | {BATCH_STATE}
        return {k: v for k, v in lb.items() if k in keys}


# --- TD-MPC -----------------------------------------------------------------------------------------


@dataclass
class TDMPCConfig:
    """TD-MPC (FOWM variant): a latent dynamics + reward + value model (TOLD) planned with MPPI/CEM."""

    image_size: int = param(64, "the camera is resized to this square size (>= 40; LeRobot's xArm preset: 84)", "model")
    camera: str = param("image", "the one camera TD-MPC sees (LeRobot 0.4.4 reads one): image or wrist_image", "model")
    horizon: int = param(
        5, "planning horizon and training window: frames t..t+horizon per sample (LeRobot: 5)", "model"
    )
    n_action_steps: int = param(
        1,
        "actions of each plan executed before planning again (the served replan_steps; <= horizon; LeRobot: 1 "
        "with 2 action repeats). Planning is ~seconds per call on a CPU, so 1 is slow in LIBERO",
        "model",
    )
    use_mpc: bool = param(True, "plan with MPPI/CEM over the latent model; False: the policy head alone", "model")
    cem_iterations: int = param(6, "MPPI/CEM iterations per plan (LeRobot: 6)", "model")
    n_gaussian_samples: int = param(128, "action sequences sampled per CEM iteration (LeRobot: 512)", "model")
    n_pi_samples: int = param(16, "sequences rolled out from the policy head per iteration (LeRobot: 51)", "model")
    n_elites: int = param(16, "best sequences the CEM refits to (<= samples; LeRobot: 50)", "model")
    latent_dim: int = param(50, "latent state size (LeRobot: 50)", "model")
    mlp_dim: int = param(256, "hidden width of the dynamics, reward, policy, Q and V heads (LeRobot: 512)", "model")
    q_ensemble_size: int = param(5, "Q functions in the ensemble (LeRobot: 5)", "model")
    image_encoder_hidden_dim: int = param(32, "channels of the image encoder (LeRobot: 32)", "model")
    state_encoder_hidden_dim: int = param(256, "hidden width of the state encoder (LeRobot: 256)", "model")
    discount: float = param(0.9, "discount factor gamma (LeRobot: 0.9)", "model")
    success_reward: float = param(
        1.0, "reward for the last action of a successful demonstration (every other step: 0)", "model"
    )
    max_random_shift_ratio: float = param(
        0.0476, "random image shift while training, as a fraction of image_size (LeRobot: 0.0476)", "model"
    )
    consistency_coeff: float = param(20.0, "weight of the latent consistency loss (LeRobot: 20)", "model")
    reward_coeff: float = param(0.5, "weight of the reward loss (LeRobot: 0.5)", "model")
    value_coeff: float = param(0.1, "weight of the Q (TD) and V (expectile) losses (LeRobot: 0.1)", "model")
    pi_coeff: float = param(0.5, "weight of the advantage-weighted policy loss (LeRobot: 0.5)", "model")
    bc_coeff: float = param(
        0.0,
        "weight of a behaviour-cloning term added to LeRobot's loss: the squared error of the policy head's "
        "action pi(encode(o_t)) against the demonstrated one, with gradients into the encoder (LeRobot's "
        "advantage-weighted term reads detached latents, so imitation never trains the encoder). "
        "0: LeRobot's loss unchanged",
        "model",
    )
    target_model_momentum: float = param(
        0.995, "EMA momentum of the target model, updated once per optimisation step (LeRobot: 0.995)", "model"
    )

    @property
    def action_horizon(self) -> int:
        return self.horizon if self.use_mpc else 1

    def check(self) -> None:
        _check_image_size("tdmpc", self.image_size)
        if self.camera not in CAMERA_NAMES:
            raise ConfigError(f"camera={self.camera!r}: use one of {', '.join(CAMERA_NAMES)}")
        for name in ("horizon", "n_action_steps", "cem_iterations", "n_gaussian_samples", "n_elites", "latent_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_pi_samples < 0:
            raise ConfigError(f"n_pi_samples={self.n_pi_samples} must be >= 0")
        if self.bc_coeff < 0:
            raise ConfigError(f"bc_coeff={self.bc_coeff} must be >= 0 (0: LeRobot's loss unchanged)")
        if self.n_elites > self.n_gaussian_samples + self.n_pi_samples:
            raise ConfigError(
                f"n_elites={self.n_elites} must be <= n_gaussian_samples + n_pi_samples = "
                f"{self.n_gaussian_samples + self.n_pi_samples}"
            )
        if self.n_action_steps > self.action_horizon:
            raise ConfigError(
                f"n_action_steps={self.n_action_steps} must be <= the plan length {self.action_horizon} "
                "(horizon with use_mpc, else 1)"
            )

    def lerobot_kwargs(self) -> dict:
        skip = ("image_size", "camera", "success_reward", "bc_coeff")
        from tutorial_utils.policies.lerobot import _same_names

        return {**_same_names(self, skip=skip), "n_action_repeats": 1}


class TDMPCPolicy(_ClosedLoop, LeRobotPolicy):
    """LeRobot's TD-MPC (``lerobot.policies.tdmpc``), one camera, trained offline with a sparse reward
    by the project's trainer (what has run of it: :data:`TDMPC_WHAT_RAN`)."""

    #: what has run of this family (the module text)
    what_ran: ClassVar[str] = TDMPC_WHAT_RAN
    name = "tdmpc"
    config_class = TDMPCConfig
    lerobot_type = "tdmpc"
    #: LeRobot's TD-MPC preset (``TDMPCConfig``: Adam at 3e-4; ``AdamConfig``: betas 0.9/0.999, no weight
    #: decay, clipping 10; no scheduler). No image shifts from the trainer: TD-MPC shifts its images
    #: itself (``max_random_shift_ratio``)
    train_defaults: ClassVar[dict] = {
        "optimizer_lr": 3e-4,
        "optimizer_grad_clip_norm": 10.0,
        "optimizer_betas": (0.9, 0.999),
        "optimizer_weight_decay": 0.0,
        "scheduler_warmup_steps": 0,
        "scheduler_decay_lr": 3e-4,
        "augment_shift": 0,
    }
    catalog = {
        "group": "reinforcement learning",
        "scenario": "model-based control: a learned world model plans each action",
        "here": "trained offline on one task's recorded demonstrations (the simulator's success as a sparse "
        "reward) and evaluated in LIBERO: the positive control below (its plans fail; with bc_coeff, an "
        "imitation term that trains its encoder, its policy head alone succeeds in some episodes); never trained "
        "online",
    }

    @property
    def cameras(self) -> tuple[str, ...]:
        return (CAMERA_NAMES[self.cfg.camera],)

    def lerobot_key(self, camera: str) -> str:
        from lerobot.utils.constants import OBS_IMAGE

        return OBS_IMAGE  # LeRobot 0.4.4's TD-MPC queues and encodes only `observation.image`

    def training_source(self, source: Any, successful: Sequence[int] | None = None) -> DemonstrationWindows:
        """The training windows this model needs from ``source``."""
        return DemonstrationWindows(source, self.cfg.horizon, self.cfg.image_size, self.cfg.success_reward, successful)

    def loss(self, batch: Mapping[str, Any], generator=None) -> dict:
        lb = self._training_batch(batch)
        if self.training and torch.is_grad_enabled():
            # LeRobot's training script calls policy.update() after each optimiser step; any trainer
            # that calls loss() once per step gets the same EMA here (a no-op on the first step)
            self.policy.update()
        with self._seeded(generator):
            loss, parts = self.policy.forward(dict(lb))
        out = {"total_loss": loss}
        for k, v in (parts or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = torch.tensor(float(v), device=loss.device)
        if self.cfg.bc_coeff > 0:
            out["bc_loss"] = self._bc_loss(lb)
            out["total_loss"] = loss + self.cfg.bc_coeff * out["bc_loss"]
        return out

    def _bc_loss(self, lb: Mapping[str, Any]) -> torch.Tensor:
        """The behaviour-cloning term of ``bc_coeff``: mean squared error of pi(encode(o_t)) against
        the demonstrated action a_t (both in LeRobot's normalised units), over the windows whose
        first frame and action are real (not padding); gradients reach the encoder."""
        m = self.policy.model
        z = m.encode(self._current_observation(lb))
        err = ((m.pi(z) - lb[BATCH_ACTION][:, 0]) ** 2).mean(dim=-1)
        real = (~lb[STATE_IS_PAD][:, 0] & ~lb[BATCH_ACTION_IS_PAD][:, 0]).float()
        return (err * real).sum() / real.sum().clamp(min=1.0)

    @torch.no_grad()
    def probe(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """What the world model makes of a batch of training windows, without shifts or noise: the
        latent of each window's first frame ``z`` (B, latent_dim), the rewards its latent rollout
        predicts under the demonstrated actions ``reward_pred`` beside the recorded ``reward`` (B,
        horizon) and ``reward_is_pad``, and ``value`` V(z) (B,) (``evaluate.latent`` reads them)."""
        lb = self._training_batch(batch)
        m = self.policy.model
        z = m.encode(self._current_observation(lb))
        preds, zt = [], z
        for t in range(lb[BATCH_ACTION].shape[1]):
            zt, r = m.latent_dynamics_and_reward(zt, lb[BATCH_ACTION][:, t])
            preds.append(r)
        return {
            "z": z,
            "reward_pred": torch.stack(preds, dim=1),
            "reward": lb[REWARD],
            "reward_is_pad": lb[REWARD_IS_PAD],
            "value": m.V(z),
        }

    @staticmethod
    def _current_observation(lb: Mapping[str, Any]) -> dict:
        """The first frame of each training window, as TD-MPC's encoder reads it."""
        from lerobot.utils.constants import OBS_IMAGE

        return {OBS_IMAGE: lb[OBS_IMAGE][:, 0], BATCH_STATE: lb[BATCH_STATE][:, 0]}

    def _training_batch(self, batch: Mapping[str, Any]) -> dict:
        """A batch of :class:`DemonstrationWindows` in LeRobot's keys, through its preprocessor."""
        h = self.cfg.horizon
        _needs_windows(self, batch, h + 1)
        from lerobot.utils.constants import OBS_IMAGE

        cam = self.cameras[0]
        images = _float_images(batch[WINDOW + cam])[:, : h + 1]
        s = self.cfg.image_size
        if tuple(images.shape[2:]) != (3, s, s):
            raise ObservationError(
                f"feature {cam}: windows of shape {tuple(images.shape[2:])}, the model is built for (3, {s}, {s}); "
                f"build them with model.training_source(source) (image_size={s})"
            )
        lb = {
            OBS_IMAGE: images,
            BATCH_STATE: torch.as_tensor(batch[WINDOW + BATCH_STATE]).float()[:, : h + 1],
            STATE_IS_PAD: torch.as_tensor(batch[STATE_IS_PAD]).bool()[:, : h + 1],
            BATCH_ACTION: torch.as_tensor(batch[BATCH_ACTION]).float()[:, :h],
            BATCH_ACTION_IS_PAD: torch.as_tensor(batch[BATCH_ACTION_IS_PAD]).bool()[:, :h],
            REWARD: torch.as_tensor(batch[REWARD]).float()[:, :h],
            REWARD_IS_PAD: torch.as_tensor(batch[REWARD_IS_PAD]).bool()[:, :h],
            INDEX: torch.as_tensor(batch.get(INDEX, torch.arange(len(images)))),
            BATCH_TASK: list(batch.get(BATCH_TASK) or [""] * len(images)),
        }
        pre, _post = self.processors()
        return pre(lb)

    def _predict_chunk(self, lb: dict) -> torch.Tensor:
        from lerobot.policies.utils import populate_queues

        obs = self._observation(lb)
        self.policy.reset()  # each served call plans from scratch (no warm start across calls)
        try:
            self.policy._queues = populate_queues(self.policy._queues, obs)
            plan = self.policy.predict_action_chunk(obs)  # (horizon, B, 7), normalised, clamped to [-1, 1]
        finally:
            self.policy.reset()
        return plan.transpose(0, 1)


# --- SAC --------------------------------------------------------------------------------------------


@dataclass
class SACConfig:
    """Soft Actor-Critic: a tanh-Gaussian actor, a critic ensemble with target copies, a learned temperature."""

    image_size: int = param(64, "camera images are resized to this square size (>= 40)", "model")
    camera: str = param("both", "cameras SAC sees: both, image or wrist_image", "model")
    latent_dim: int = param(
        64,
        "size each camera and the state are encoded to before the actor and critics (guide: latent_dim; "
        "LeRobot: 256; 64 on a CPU)",
        "model",
    )
    image_encoder_hidden_dim: int = param(32, "channels of the image encoder (LeRobot: 32)", "model")
    image_embedding_pooling_dim: int = param(8, "learned spatial pooling features per camera (LeRobot: 8)", "model")
    hidden_dims: list[int] = param(
        [256, 256], "hidden widths of the actor and of each critic (LeRobot: 256,256)", "model"
    )
    num_critics: int = param(2, "critics in the ensemble (LeRobot: 2)", "model")
    discount: float = param(0.99, "discount factor gamma (LeRobot: 0.99)", "model")
    temperature_init: float = param(1.0, "initial entropy temperature alpha (LeRobot: 1.0)", "model")
    critic_target_update_weight: float = param(
        0.005, "soft update rate tau of the target critics (LeRobot: 0.005)", "model"
    )
    actor_lr: float = param(3e-4, "actor learning rate (LeRobot: 3e-4)", "model")
    critic_lr: float = param(3e-4, "critic learning rate (LeRobot: 3e-4)", "model")
    temperature_lr: float = param(3e-4, "temperature learning rate (LeRobot: 3e-4)", "model")
    policy_update_freq: int = param(1, "critic updates per actor/temperature update (LeRobot: 1)", "model")
    grad_clip_norm: float = param(40.0, "gradient clipping of each update (LeRobot: 40)", "model")
    success_reward: float = param(1.0, "reward for the last transition of a successful demonstration", "model")

    @property
    def action_horizon(self) -> int:
        return 1  # SAC returns one action per observation

    @property
    def n_action_steps(self) -> int:
        return 1

    def check(self) -> None:
        _check_image_size("sac", self.image_size)
        if self.camera not in ("both", *CAMERA_NAMES):
            raise ConfigError(f"camera={self.camera!r}: use both, {' or '.join(CAMERA_NAMES)}")
        if not self.hidden_dims or any(d < 1 for d in self.hidden_dims):
            raise ConfigError(f"hidden_dims={self.hidden_dims} must be positive widths, e.g. 256,256")
        for name in ("latent_dim", "num_critics", "policy_update_freq", "image_encoder_hidden_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")

    def lerobot_kwargs(self) -> dict:
        from lerobot.policies.sac.configuration_sac import ActorNetworkConfig, CriticNetworkConfig

        keep = (
            "latent_dim",
            "image_encoder_hidden_dim",
            "image_embedding_pooling_dim",
            "num_critics",
            "discount",
            "temperature_init",
            "critic_target_update_weight",
            "actor_lr",
            "critic_lr",
            "temperature_lr",
            "policy_update_freq",
            "grad_clip_norm",
        )
        return {
            **{k: getattr(self, k) for k in keep},
            "state_encoder_hidden_dim": self.latent_dim,
            "critic_network_kwargs": CriticNetworkConfig(hidden_dims=list(self.hidden_dims)),
            "actor_network_kwargs": ActorNetworkConfig(hidden_dims=list(self.hidden_dims)),
            "freeze_vision_encoder": False,  # LeRobot freezes it for a pretrained encoder; ours learns from scratch
            "use_torch_compile": False,
        }


class SACPolicy(_ClosedLoop, LeRobotPolicy):
    """LeRobot's SAC (``lerobot.policies.sac``), updated from demonstration transitions with
    :meth:`update` (so far only a 2-step smoke test: :data:`SAC_WHAT_RAN`); the project's trainer
    refuses it with :attr:`trainer_refusal`."""

    #: what has run of this family (the module text)
    what_ran: ClassVar[str] = SAC_WHAT_RAN
    #: why ``python -m tutorial_utils train policy=sac`` stops before it starts, and where to go
    trainer_refusal: ClassVar[str] = (
        "policy=sac is not trained by `python -m tutorial_utils train`: SAC updates three networks (critic, actor, "
        "temperature), each with its own optimiser, from transitions (s, a, r, s', done), and the trainer runs one "
        "loss with one optimiser. " + SAC_WHAT_RAN + ". What works here: building it, "
        "SACPolicy.update(batch, model.make_optimizers()) or tutorial_utils.policies.lerobot_rl.offline_steps(model, "
        "model.training_source(source), steps) in your own loop, saving, serving (one action per request). To learn "
        "a LIBERO task with SAC, run LeRobot's actor/learner pair (python -m lerobot.rl.learner and python -m "
        "lerobot.rl.actor) with an environment loop and a reward, a GPU-scale job. To train a policy on the "
        "demonstrations here, pick a family the trainer trains: {families}."
    )
    name = "sac"
    config_class = SACConfig
    lerobot_type = "sac"
    #: its actor, critics and temperature need three optimisers (:meth:`update`); the trainer has one
    trains_here = False
    catalog = {
        "group": "reinforcement learning",
        "scenario": "adaptive control learned from reward, online in a simulator",
        "here": "a 2-step smoke test of its update on a 24-frame synthetic source only: never trained on the "
        "recorded demonstrations, never evaluated in LIBERO; the trainer does not train it (train policy=sac)",
    }

    @property
    def cameras(self) -> tuple[str, ...]:
        return BATCH_CAMERAS if self.cfg.camera == "both" else (CAMERA_NAMES[self.cfg.camera],)

    def training_source(self, source: Any, successful: Sequence[int] | None = None) -> DemonstrationWindows:
        """Transitions ``(s_t, a_t, r_t, s_t+1, done_t)`` of ``source``: windows of one step."""
        return DemonstrationWindows(source, 1, self.cfg.image_size, self.cfg.success_reward, successful)

    # LeRobot's SAC shares one encoder between the actor, the critics and the target critics, so one
    # tensor appears under several names; safetensors refuses aliases. The checkpoint keeps each
    # tensor once, under its first name, and loading fills the other names from it.
    def _aliases(self) -> dict[str, str]:
        full = nn.Module.state_dict(self)
        first: dict[tuple, str] = {}
        out: dict[str, str] = {}
        for k, v in full.items():
            if not v.numel():
                continue
            key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), v.stride())
            if key in first:
                out[k] = first[key]
            else:
                first[key] = k
        return out

    def state_dict(self, *args, **kwargs):
        sd = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", "")
        for alias in self._aliases():
            sd.pop(prefix + alias, None)
        return sd

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        full = dict(state_dict)
        for alias, canonical in self._aliases().items():
            if alias not in full and canonical in full:
                full[alias] = full[canonical]
        return super().load_state_dict(full, strict=strict, assign=assign)

    def make_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """One Adam per part, as LeRobot's learner builds them (actor, critic, temperature)."""
        groups = self.policy.get_optim_params()
        return {
            "actor": torch.optim.Adam(groups["actor"], lr=self.cfg.actor_lr),
            "critic": torch.optim.Adam(groups["critic"], lr=self.cfg.critic_lr),
            "temperature": torch.optim.Adam([groups["temperature"]], lr=self.cfg.temperature_lr),
        }

    def transitions(self, batch: Mapping[str, Any]) -> dict:
        """A window batch of one step -> LeRobot's SAC batch (normalised by its pre-processor)."""
        _needs_windows(self, batch, 2)

        def frame(k: int, with_action: bool) -> dict:
            b = {cam: _float_images(batch[WINDOW + cam])[:, k] for cam in self.cameras}
            b[BATCH_STATE] = torch.as_tensor(batch[WINDOW + BATCH_STATE]).float()[:, k]
            if with_action:
                b[BATCH_ACTION] = torch.as_tensor(batch[BATCH_ACTION]).float()[:, :1]
                b[BATCH_ACTION_IS_PAD] = torch.as_tensor(batch[BATCH_ACTION_IS_PAD]).bool()[:, :1]
            return self._lerobot_batch(b, with_action=with_action)

        now, nxt = frame(0, True), frame(1, False)
        return {
            BATCH_ACTION: now[BATCH_ACTION][:, 0],
            "state": self._observation(now),
            "next_state": self._observation(nxt),
            "reward": torch.as_tensor(batch[REWARD]).float()[:, 0],
            "done": torch.as_tensor(batch[DONE]).float()[:, 0],
        }

    def update(self, batch: Mapping[str, Any], optimizers: Mapping[str, torch.optim.Optimizer], step: int = 0) -> dict:
        """One learner step on a batch of transitions: the critic, then (every ``policy_update_freq``
        steps) the actor and the temperature, then the target critics' soft update. Returns the losses."""
        sac = self.transitions(batch)
        p, clip = self.policy, self.cfg.grad_clip_norm
        out: dict[str, float] = {}

        def step_on(name: str, loss: torch.Tensor, params) -> None:
            optimizers[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(list(params), clip)
            optimizers[name].step()
            out[f"loss_{name}"] = float(loss.detach())

        self.train()
        step_on("critic", p.forward(sac, "critic")["loss_critic"], p.critic_ensemble.parameters())
        if step % self.cfg.policy_update_freq == 0:
            step_on("actor", p.forward(sac, "actor")["loss_actor"], p.actor.parameters())
            step_on("temperature", p.forward(sac, "temperature")["loss_temperature"], [p.log_alpha])
        p.update_target_networks()
        out["temperature"] = float(p.temperature)
        return out

    def loss(self, batch: Mapping[str, Any], generator=None) -> dict:
        _needs_windows(self, batch, 2)
        raise PolicyUnavailable(
            "policy 'sac' is updated with three optimisers (critic, actor, temperature), not one loss: use "
            "SACPolicy.update(batch, model.make_optimizers()) or offline_steps(model, model.training_source(source), steps)."
        )

    def _predict_chunk(self, lb: dict) -> torch.Tensor:
        return self.policy.select_action(self._observation(lb)).unsqueeze(1)  # (B, 1, 7), normalised


# --- offline optimisation ---------------------------------------------------------------------------


def offline_steps(
    model: LeRobotPolicy,
    windows: DemonstrationWindows,
    steps: int,
    batch_size: int = 8,
    lr: float = 3e-4,
    seed: int = 0,
    grad_clip_norm: float = 10.0,
) -> list[dict[str, float]]:
    """``steps`` optimisation steps of a TD-MPC or SAC model on demonstration windows (frames drawn
    with ``seed``); returns each step's losses. TD-MPC: one Adam on its loss (the target model's EMA
    runs inside ``loss``); SAC: :meth:`SACPolicy.update` with its three optimisers."""
    if len(windows) == 0:
        raise ConfigError(f"{windows.name}: no frames to train on")
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    history: list[dict[str, float]] = []
    if isinstance(model, SACPolicy):
        opts = model.make_optimizers()
        for step in range(steps):
            history.append(model.update(windows.batch(rng.integers(0, len(windows), batch_size)), opts, step))
        return history
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    for _ in range(steps):
        parts = model.loss(windows.batch(rng.integers(0, len(windows), batch_size)), generator=gen)
        opt.zero_grad(set_to_none=True)
        parts["total_loss"].backward()
        torch.nn.utils.clip_grad_norm_(params, grad_clip_norm)
        opt.step()
        history.append({k: float(v.detach()) for k, v in parts.items()})
    return history
