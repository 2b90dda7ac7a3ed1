"""The training seam: :class:`TrainablePolicy`, the mixin every trainable family implements, and
:class:`ServedModel`, the adapter that serves any of them (see :mod:`tutorial_utils.policies.base`
for the serving interface and the batch keys)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar

from tutorial_utils.policies import checkpoint
from tutorial_utils.policies.base import (
    BATCH_CAMERAS,
    BATCH_STATE,
    BATCH_TASK,
    EPISODE_KEY,
    OBSERVE_ONLY_KEY,
    PAD_SUFFIX,
    Policy,
    observation_to_batch,
)


class TrainablePolicy:
    """The training seam. A family subclasses ``torch.nn.Module`` and this class, sets
    :attr:`name` and :attr:`config_class`, and implements ``__init__(config, statistics)``,
    :meth:`loss` and :meth:`predict`. Everything else (building from overrides, checkpoints,
    serving, parameter counts, freezing by module name) is shared, and the trainer calls only
    what this class declares: :meth:`forward` (the loss, through ``nn.Module.__call__`` so DDP and
    accelerate see it), :meth:`training_source` and :meth:`optimizer`, each with a default a
    family may override.

    The family's facts live here too, as class attributes the zoo, the train job and the book
    read: :attr:`catalog` (its row in the zoo's catalogue), :attr:`comparison` (whether the zoo
    compares it), :attr:`timing_overrides` and :attr:`train_defaults` (its training recipe).
    A GPU-server family also sets ``needs_gpu_server`` and ``gpu_recipe``.
    """

    #: the registry name (also written into every checkpoint's config.json)
    name: ClassVar[str] = ""
    #: a dataclass of the family's parameters, declared with ``tutorial_utils.params.param``
    config_class: ClassVar[type] = type(None)
    #: the gripper convention of the actions the family predicts (LIBERO datasets: "dataset")
    gripper: ClassVar[str] = "dataset"
    #: its row in the zoo's catalogue: ``{"group": ..., "scenario": ..., "here": ...}`` (what the
    #: platform guide uses it for and exactly how far it goes in this project); None: not listed
    catalog: ClassVar[Mapping[str, str] | None] = None
    #: whether ``python -m tutorial_utils train policy=<name>`` (the project's trainer) trains it
    trains_here: ClassVar[bool] = True
    #: whether the zoo's comparison trains and evaluates it (``experiments.catalog.comparison_families``)
    comparison: ClassVar[bool] = False
    #: config overrides that only the zoo's step timing uses (``{field: value}``)
    timing_overrides: ClassVar[Mapping[str, Any]] = {}
    #: the family's own values of :class:`TrainConfig` fields whose default is None ("the family's
    #: own"): its training recipe (``optimizer_lr``, betas, clipping, warm-up, ``augment_shift``: the
    #: fields of ``train.config.RECIPE``, the book's recipe where a family names none) and
    #: ``freeze_modules``. ``{field: value}`` or ``{field: params.by_profile(ci, cpu, gpu)}``. The train
    #: job, the zoo and the sweep all train the family with them unless given other values
    train_defaults: ClassVar[Mapping[str, Any]] = {}
    #: the loss accepts a batch whose tensors are already on the model's device (the trainer then
    #: copies each batch there from pinned memory without blocking); False: the family moves what
    #: it needs itself (for example through numpy)
    accepts_device_batch: ClassVar[bool] = False
    #: submodules whose ``forward`` takes only tensors, compiled by ``compile=true``; empty: the
    #: whole model is compiled (graph breaks at Python-only code such as tokenisers)
    compile_targets: ClassVar[tuple[str, ...]] = ()

    cfg: Any
    statistics: dict

    # -- what the family implements
    def loss(self, batch: Mapping[str, Any], generator=None) -> dict:  # pragma: no cover - abstract
        """The training loss of a batch: ``{"total_loss": scalar tensor, ...named parts}``."""
        raise NotImplementedError

    def predict(self, batch: Mapping[str, Any], generator=None):  # pragma: no cover - abstract
        """Action chunks (B, action_horizon, action_dim) float32 numpy in robot units."""
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # ``class F(nn.Module, TrainablePolicy)`` finds nn.Module's placeholder forward first; a
        # family that defines none gets the seam's
        if getattr(cls.forward, "__name__", "") == "_forward_unimplemented":
            cls.forward = TrainablePolicy.forward  # type: ignore[method-assign]

    def forward(self, batch: Mapping[str, Any], generator=None) -> dict:
        """What the trainer calls (as ``model(batch, generator)``): the loss of a batch, as
        :meth:`loss` returns it. A family whose ``forward`` means something else overrides this
        with its own and keeps ``loss``."""
        return self.loss(batch, generator)

    # -- hooks of the trainer, with defaults
    def training_source(self, source: Any) -> Any:
        """The data the trainer draws windows from: the dataset source as it is (a family that
        learns from longer windows, such as TD-MPC, wraps it)."""
        return source

    def parameter_groups(self, cfg: Any) -> list[dict]:
        """The optimiser's parameter groups: every trainable parameter in one group (a family may
        give its parts their own learning rates or weight decay)."""
        return [{"params": [p for p in self.parameters() if p.requires_grad]}]  # type: ignore[attr-defined]

    @classmethod
    def first_phase_steps(cls, config: Any) -> int:
        """Steps of a first training phase under the family's ``config`` (VQ-BeT's action codes; 0
        for a family trained in one phase). The learning-rate schedule runs it at the full rate, its
        warm-up and decay coming after it, as LeRobot schedules VQ-BeT; the zoo's timing shortens it
        (``timing_overrides``) and adds its steps on top of the ones a budget buys."""
        return 0

    def optimizer(self, cfg: Any):
        """The optimiser the trainer steps (``cfg`` is the ``TrainConfig``): AdamW with the
        config's learning rate, betas and weight decay over :meth:`parameter_groups` (the fused
        kernel where torch has one for the device). A family may return another."""
        import torch

        return torch.optim.AdamW(
            self.parameter_groups(cfg),
            lr=cfg.optimizer_lr,
            betas=tuple(cfg.optimizer_betas),
            weight_decay=cfg.optimizer_weight_decay,
            fused=True,
        )

    @classmethod
    def train_default(cls, name: str, fallback: Any = None) -> Any:
        """This family's default for the train job's ``name`` in the active profile."""
        from tutorial_utils import profiles

        value = cls.train_defaults.get(name, fallback)
        if isinstance(value, Mapping) and set(value) == set(profiles.PROFILES):
            return value[profiles.current()]
        return value

    # -- what the training data must provide
    @property
    def action_horizon(self) -> int:
        return int(self.cfg.action_horizon)

    @property
    def image_size(self) -> int:
        return int(self.cfg.image_size)

    @property
    def n_obs_steps(self) -> int:
        """Observation frames per sample (the current one and the ones before it, one step apart)."""
        return int(getattr(self.cfg, "n_obs_steps", 1) or 1)

    # -- shared
    @classmethod
    def build(cls, config: Any = None, statistics: Mapping[str, Any] | None = None):
        """A new model from a config instance, a ``{name: value}`` mapping or None (defaults)."""
        return cls(make_config(cls, config), statistics)

    @classmethod
    def load(cls, directory, device: str = "cpu"):
        """A ready model (eval mode, on ``device``) from a checkpoint directory of this family."""
        return checkpoint.load_policy(directory, cls, device=device)

    def save(self, directory, extra: Mapping[str, Any] | None = None):
        """Write the checkpoint directory atomically (see :mod:`tutorial_utils.policies.checkpoint`)."""
        return checkpoint.save_policy(self, directory, extra)

    def module_names(self, depth: int = 2) -> list[str]:
        """Dotted module names up to ``depth`` levels (what ``freeze_modules`` accepts)."""
        return [n for n, _ in self.named_modules() if n and n.count(".") < depth]  # type: ignore[attr-defined]

    def parameter_counts(self) -> dict[str, int]:
        params = list(self.parameters())  # type: ignore[attr-defined]
        total = sum(p.numel() for p in params)
        trainable = sum(p.numel() for p in params if p.requires_grad)
        return {"total": total, "trainable": trainable, "frozen": total - trainable}

    def serving_policy(
        self,
        checkpoint: str = "",
        replan_steps: int | None = None,
        gripper: str | None = None,
        seed: int | None = 0,
        image_size: int | None = None,
        temporal_ensemble: float | None = None,
    ) -> Policy:
        """This model behind the serving :class:`Policy` interface."""
        return ServedModel(
            self,
            checkpoint=checkpoint,
            replan_steps=replan_steps,
            gripper=gripper,
            seed=seed,
            image_size=image_size,
            temporal_ensemble=temporal_ensemble,
        )


def make_config(family: type, config: Any = None):
    """``family.config_class`` from an instance, a mapping of overrides or None."""
    from tutorial_utils import params

    cls = family.config_class
    if config is None:
        return cls()
    if isinstance(config, cls):
        return config
    if isinstance(config, Mapping):
        return params.from_mapping(cls, config, f"`python -m tutorial_utils train --list-params policy={family.name}`")
    raise TypeError(
        f"policy {family.name!r}: config must be a {cls.__name__}, a mapping or None, got {type(config).__name__}"
    )


class TimeWindows:
    """A training source whose windows have LeRobot's ``delta_timestamps`` shape: observations at
    ``obs_deltas`` (frame offsets, e.g. ``[-1, 0]``: (T, H, W, 3) images, (T, 8) states and
    ``<key>_is_pad`` masks) and actions at ``action_deltas`` (e.g. ``[-1, ..., 14]``), each index
    clamped into its episode and marked as padding outside it. Everything else is the source's."""

    def __init__(self, source: Any, obs_deltas, action_deltas):
        self.source = source
        self.obs_deltas = [int(d) for d in obs_deltas]
        self.action_deltas = [int(d) for d in action_deltas]

    def get(self, i: int, horizon: int, image_size: int | None = None) -> dict:
        return self.source.get(
            i, horizon, obs_deltas=self.obs_deltas, action_deltas=self.action_deltas, image_size=image_size
        )

    def __len__(self) -> int:
        return len(self.source)

    def __getattr__(self, name: str):
        if name == "source":  # not set yet (unpickling in a DataLoader worker)
            raise AttributeError(name)
        return getattr(self.source, name)


class ServedModel(Policy):
    """A :class:`TrainablePolicy` behind the serving interface: one observation in, one chunk out.

    ``replan_steps`` defaults to the whole chunk; ``seed`` fixes the initial noise of each call
    (None: random); ``gripper`` and ``image_size`` default to what the checkpoint's dataset said.

    A model with ``n_obs_steps`` > 1 sees the last ``n_obs_steps`` observations of the episode,
    kept here: before the episode has that many, the first one is repeated and marked as padding
    (what the training windows and LeRobot's ``select_action`` do). The history starts again on
    :meth:`reset` (the server calls it on every new connection and on openpi's ``episode_start``
    control frame, which current openpi's LIBERO loop sends before each episode), when a request's
    ``episode_id`` changes (our LIBERO client sends one per episode) and when the prompt changes. A
    request with ``observe_only`` set only joins the history (the reply's chunk is empty): our client
    sends the frames between two predictions that way, so the history is one environment step apart
    as in training. openpi's client sends only the frames it predicts from, so there the history is
    ``replan_steps`` apart (and an older client without ``episode_start``, like PyPI's openpi-client
    0.1.2, carries it across the episodes of one task on one connection).

    ``temporal_ensemble`` (a coefficient, ACT's 0.01; None: off) answers each request with one action,
    the running average of every chunk's prediction for this step
    (:class:`~tutorial_utils.policies.ensemble.TemporalEnsembler`, reset with the episode as the
    history is), and announces ``replan_steps`` 1 so the client asks at every step.
    """

    def __init__(
        self,
        model,
        checkpoint: str = "",
        replan_steps: int | None = None,
        gripper: str | None = None,
        seed: int | None = 0,
        image_size: int | None = None,
        temporal_ensemble: float | None = None,
    ):
        from tutorial_utils.policies.ensemble import TemporalEnsembler

        self.model, self.checkpoint, self.seed = model, str(checkpoint or ""), seed
        self.name = model.name
        self._replan, self._gripper, self._image_size = replan_steps, gripper, image_size
        self.n_obs_steps = int(getattr(model, "n_obs_steps", 1) or 1)
        self._history: deque = deque(maxlen=self.n_obs_steps)
        self._episode: tuple | None = None
        self._ensembler = (
            None if temporal_ensemble is None else TemporalEnsembler(temporal_ensemble, model.action_horizon)
        )

    def reset(self) -> None:
        self._history.clear()
        self._episode = None
        if self._ensembler is not None:
            self._ensembler.reset()

    def _follow_episode(self, obs: dict[str, Any], task: str) -> None:
        """Start the per-episode state again when the request's episode id or prompt changes."""
        episode = (obs.get(EPISODE_KEY), task)
        if episode != self._episode:
            self.reset()
            self._episode = episode

    def _batch(self, obs: dict[str, Any]) -> dict[str, Any]:
        """The batch of one for this request: the observation, or the episode's last
        ``n_obs_steps`` observations with a time axis (B=1, T, ...)."""
        import numpy as np

        batch = observation_to_batch(obs)
        if self.n_obs_steps > 1 or self._ensembler is not None:
            self._follow_episode(obs, batch[BATCH_TASK][0])
        if self.n_obs_steps == 1:
            return batch
        self._history.append(batch)
        frames = list(self._history)
        missing = self.n_obs_steps - len(frames)
        frames = [frames[0]] * missing + frames
        pad = np.array([True] * missing + [False] * len(self._history))[None]
        out: dict[str, Any] = {BATCH_TASK: batch[BATCH_TASK]}
        for key in (*BATCH_CAMERAS, BATCH_STATE):
            out[key] = np.stack([f[key][0] for f in frames])[None]
            out[key + PAD_SUFFIX] = pad
        return out

    @property
    def metadata(self) -> dict[str, Any]:
        """What the server announces to every client. ``checkpoint`` is only the checkpoint's last
        part (``checkpoints/last``, or the folder's name): clients never see the server's paths."""
        from pathlib import PurePath

        h = self.model.action_horizon
        ck = PurePath(self.checkpoint) if self.checkpoint else None
        shown = "" if ck is None else (f"{ck.parent.name}/{ck.name}" if ck.parent.name == "checkpoints" else ck.name)
        return {
            **super().metadata,
            "image_size": self._image_size or self.model.image_size,
            "action_horizon": h,
            "replan_steps": 1 if self._ensembler is not None else int(self._replan or h),
            "gripper": self._gripper or self.model.gripper,
            "checkpoint": shown,
            "n_obs_steps": self.n_obs_steps,
            **({"temporal_ensemble": self._ensembler.coeff} if self._ensembler is not None else {}),
        }

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        import numpy as np
        import torch

        batch = self._batch(obs)
        if obs.get(OBSERVE_ONLY_KEY):
            return {"actions": np.zeros((0, 7), np.float32)}
        gen = torch.Generator().manual_seed(self.seed) if self.seed is not None else None
        chunk = self.model.predict(batch, generator=gen)[0]
        if self._ensembler is not None:
            return {"actions": self._ensembler.update(chunk)[None]}
        return {"actions": chunk}

    def normalize_actions(self, actions):
        """Robot units -> the normalised space of ``dataset_statistics.json`` (what a DiT4DiT
        client expects under ``data.normalized_actions``; it un-normalises itself)."""
        import numpy as np

        from tutorial_utils.policies.normalize import ActionNormalizer

        norm = ActionNormalizer.from_statistics(self.model.statistics)
        return norm.normalize(np.asarray(actions, dtype=np.float32)).astype(np.float32)
