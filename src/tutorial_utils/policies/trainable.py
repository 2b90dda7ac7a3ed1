"""The training seam: :class:`TrainablePolicy`, the mixin every trainable family implements, and
:class:`ServedModel`, the adapter that serves any of them (see :mod:`tutorial_utils.policies.base`
for the serving interface and the batch keys)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from tutorial_utils.policies import checkpoint
from tutorial_utils.policies.base import Policy, observation_to_batch


class TrainablePolicy:
    """The training seam. A family subclasses ``torch.nn.Module`` and this class, sets
    :attr:`name` and :attr:`config_class`, and implements ``__init__(config, statistics)``,
    :meth:`loss` and :meth:`predict`. Everything else (building from overrides, checkpoints,
    serving, parameter counts, freezing by module name) is shared.
    """

    #: the registry name (also written into every checkpoint's config.json)
    name: ClassVar[str] = ""
    #: a dataclass of the family's parameters, declared with ``tutorial_utils.params.param``
    config_class: ClassVar[type] = type(None)
    #: the gripper convention of the actions the family predicts (LIBERO datasets: "dataset")
    gripper: ClassVar[str] = "dataset"
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

    # -- what the training data must provide
    @property
    def action_horizon(self) -> int:
        return int(self.cfg.action_horizon)

    @property
    def image_size(self) -> int:
        return int(self.cfg.image_size)

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
    ) -> Policy:
        """This model behind the serving :class:`Policy` interface."""
        return ServedModel(
            self, checkpoint=checkpoint, replan_steps=replan_steps, gripper=gripper, seed=seed, image_size=image_size
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


class ServedModel(Policy):
    """A :class:`TrainablePolicy` behind the serving interface: one observation in, one chunk out.

    ``replan_steps`` defaults to the whole chunk; ``seed`` fixes the initial noise of each call
    (None: random); ``gripper`` and ``image_size`` default to what the checkpoint's dataset said.
    """

    def __init__(
        self,
        model,
        checkpoint: str = "",
        replan_steps: int | None = None,
        gripper: str | None = None,
        seed: int | None = 0,
        image_size: int | None = None,
    ):
        self.model, self.checkpoint, self.seed = model, str(checkpoint or ""), seed
        self.name = model.name
        self._replan, self._gripper, self._image_size = replan_steps, gripper, image_size

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
            "replan_steps": int(self._replan or h),
            "gripper": self._gripper or self.model.gripper,
            "checkpoint": shown,
        }

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        import torch

        gen = torch.Generator().manual_seed(self.seed) if self.seed is not None else None
        return {"actions": self.model.predict(observation_to_batch(obs), generator=gen)[0]}

    def normalize_actions(self, actions):
        """Robot units -> the normalised space of ``dataset_statistics.json`` (what a DiT4DiT
        client expects under ``data.normalized_actions``; it un-normalises itself)."""
        import numpy as np

        from tutorial_utils.policies.normalize import ActionNormalizer

        norm = ActionNormalizer.from_statistics(self.model.statistics)
        return norm.normalize(np.asarray(actions, dtype=np.float32)).astype(np.float32)
