"""Every training parameter in one typed dataclass (:class:`TrainConfig`), its aliases and checks.

The platform's names are canonical (``batch_size``, ``steps``, ``seed``, ``num_workers``,
``eval_freq``, ``log_freq``, ``save_freq``, ``save_checkpoint``, ``optimizer_*``,
``scheduler_*``); DiT4DiT's override names are aliases (:data:`ALIASES`:
``per_device_batch_size`` -> ``batch_size``, ``max_train_steps`` -> ``steps`` ...), and the
``trainer.`` / ``datasets.vla_data.`` / ``framework.`` prefixes are accepted, so a DiT4DiT
command line reads the same.

The policy is a family from the registry (``policy``, default ``mini``) with its own typed
config (``policy_config``): ``policy.<name>=value`` sets one of its fields, and so does the bare
``<name>`` when no training parameter has that name (``model_dim=256``). The loop never names a
family; it builds whatever :func:`tutorial_utils.policies.make` returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tutorial_utils import params
from tutorial_utils.errors import ConfigError, TutorialError
from tutorial_utils.params import param


class DatasetNotReady(TutorialError, ValueError):
    """The dataset lacks what training needs (modality.json, statistics)."""


def _p(default: Any, help: str, group: str = "training", **profiles: Any) -> Any:
    return param(default, help, group, **profiles)


#: ``precision`` values: auto is bf16 autocast on CUDA and fp32 elsewhere.
PRECISIONS = ("auto", "fp32", "bf16")
#: ``compile_backend`` values (torch.compile backends).
COMPILE_BACKENDS = ("inductor", "aot_eager")
#: ``keep_optimizer``: every step_* checkpoint keeps its optimizer state, or only the newest
KEEP_OPTIMIZER = ("all", "last")

#: The book's training recipe, DiT4DiT's scaled to each profile: the value of each of these
#: :class:`TrainConfig` fields for a family whose ``train_defaults`` names none (a field left None;
#: a value given to the job always wins). LeRobot's families name their own (ACT and TD-MPC their
#: whole LeRobot preset); :func:`family_recipe` shows what a family trains with.
RECIPE: dict[str, Any] = {
    "optimizer_lr": params.by_profile(1e-4, cpu=3e-4),
    "optimizer_weight_decay": 1e-4,
    "optimizer_grad_clip_norm": 1.0,
    "optimizer_betas": (0.9, 0.95),
    "scheduler_warmup_steps": params.by_profile(0, cpu=200, gpu=1000),
    "scheduler_decay_lr": 1e-5,
    "augment_shift": 4,
}


def _same(a: Any, b: Any) -> bool:
    return (list(a) if isinstance(a, (list, tuple)) else a) == (list(b) if isinstance(b, (list, tuple)) else b)


def family_recipe(policy: str, profile: str | None = None) -> dict[str, Any]:
    """What family ``policy`` trains with when the job is given none of :data:`RECIPE`'s fields, in
    ``profile`` (None: the active one): its own ``train_defaults`` where it names a field, else the
    book's recipe."""
    from tutorial_utils import policies, profiles

    fam = policies.family(policy)
    profile = profile or profiles.current()

    def at(value: Any) -> Any:
        if isinstance(value, Mapping) and set(value) == set(profiles.PROFILES):
            value = value[profile]
        return tuple(value) if isinstance(value, list) else value

    return {name: at(fam.train_defaults.get(name, value)) for name, value in RECIPE.items()}


@dataclass
class TrainConfig:
    """Every training parameter. Platform names are canonical; DiT4DiT names are aliases."""

    # data and run
    dataset: str = _p(
        "synthetic",
        "LeRobot v2.1 dataset: a name under data/, a path, or synthetic (a small generated one; the train job "
        "writes it into the run directory). Alias data_mix.",
        "data",
        cpu="libero_spatial_no_noops_expert_128_init10_lerobot",
        gpu="libero_spatial_no_noops_expert_256_lerobot",
    )
    output_dir: str | None = _p(
        None,
        "run directory: logs, metrics, checkpoints (a fresh one per run; the train job's run directory)",
        "data",
        job=False,
    )
    run_id: str | None = _p(None, "experiment id printed in `[Exp: id]` lines (None: output_dir's name)", "data")
    val_fraction: float = _p(
        0.1,
        "share of episodes held out for the validation action error "
        "(at least one episode when the dataset has two or more)",
        "data",
    )
    val_samples: int = _p(64, "held-out frames scored at each evaluation (evenly spaced)", "data")
    data_cache_mb: int = _p(
        1024,
        "decoded-video cache per data process, MB (whole episodes are decoded once; a cache smaller than the "
        "dataset's decoded frames decodes episodes again and again, and the decoding takes the trainer's cores)",
        "data",
        cpu=4096,
        gpu=1024,
    )
    # the policy family
    policy: str = _p(
        "mini", "policy family from the registry (`tutorial_utils.policies.trainable()`: mini, mlp, ...)", "policy"
    )
    policy_config: Any = dataclasses.field(default=None, metadata={"help": None, "group": "policy"})
    # the training platform's parameters
    batch_size: int = _p(
        1,
        "samples per step per process (alias per_device_batch_size). 1-32; larger is steadier but needs more memory",
        cpu=32,
        gpu=64,
    )
    steps: int = _p(
        2,
        "total optimisation steps (alias max_train_steps). Start near 10k and adjust from the validation curve",
        cpu=10000,
        gpu=20000,
    )
    seed: int = _p(42, "seed of the weights, the data order and the noise: same seed, same run")
    num_workers: int | None = _p(
        0,
        "DataLoader worker processes (0: load in the main process). None: chosen from the cores "
        "(tutorial_utils.train.speed.auto_workers: the cores this process may use, shared among the training "
        "processes of the machine, one left for each training process, at most 8)",
        cpu=None,
        gpu=None,
    )
    grad_accum_steps: int = _p(
        1,
        "gradient accumulation: each optimisation step sums the gradients of N batches of batch_size "
        "(effective batch: batch_size x N x processes; `steps` counts optimisation steps). 1: off",
    )
    ema_decay: float = _p(
        0.0,
        "keep an exponential moving average of the weights with this decay (0.999-0.9999; warmed up as "
        "min(decay, (1+step)/(10+step))); validation, best, checkpoints' served weights and final_model use it, "
        "the raw weights stay in training_state.pt for resume. 0: off",
        cpu=0.999,
    )
    eval_freq: int = _p(
        0,
        "evaluate the validation action error every N steps (alias eval_interval; "
        "about 10% of steps; 0: only at the end)",
        cpu=500,
        gpu=2000,
    )
    log_freq: int = _p(
        1,
        "print the loss line and write a metrics row every N steps (alias logging_frequency; 10-100)",
        cpu=25,
        gpu=100,
    )
    save_freq: int = _p(
        0,
        "save a checkpoint every N steps (alias save_interval; about 30% of steps; 0: only at the end)",
        cpu=2500,
        gpu=6000,
    )
    time_limit_min: float = _p(
        0.0,
        "stop after this many minutes of training and finish as if `steps` were reached "
        "(checkpoint, final_model); a budget for the CPU chain. 0: no limit",
    )
    save_checkpoint: bool = _p(True, "write checkpoints (step_*, last, best); off: only final_model")
    keep_last: int = _p(
        0,
        "keep only the newest N step_* checkpoints (never the one `last` points to, nor `best` and the "
        "step_* it came from); 0: keep all",
    )
    keep_optimizer: str = _p(
        "all",
        "which step_* checkpoints keep the optimizer state a resume needs: all, or last (only the newest; "
        "older ones keep weights, scheduler and RNG, about a third of the size for LeRobot families, and can "
        "still be served, evaluated or used as pretrained_checkpoint, but not resumed from)",
    )
    # the family's recipe: None takes the family's own value (its train_defaults), else RECIPE's
    optimizer_lr: float | None = _p(
        None,
        "peak learning rate of the optimiser (1e-5..1e-4; lower when fine-tuning). None: the family's recipe "
        "(`train.config.family_recipe`)",
        "optimizer",
    )
    optimizer_weight_decay: float | None = _p(
        None, "AdamW weight decay (0.0..0.01). None: the family's recipe", "optimizer"
    )
    optimizer_grad_clip_norm: float | None = _p(
        None, "clip the gradient norm to this; 0 disables. None: the family's recipe", "optimizer"
    )
    optimizer_betas: tuple[float, ...] | None = _p(
        None, "AdamW betas, e.g. 0.9,0.95 (DiT4DiT) or 0.9,0.999 (LeRobot). None: the family's recipe", "optimizer"
    )
    scheduler_warmup_steps: int | None = _p(
        None,
        "linear warm-up steps from 0 to optimizer_lr (5-10% of steps; 0: none). None: the family's recipe",
        "scheduler",
    )
    scheduler_decay_steps: int = _p(
        0,
        "cosine decay steps after warm-up down to scheduler_decay_lr (80-90% of steps; 0: all remaining steps)",
        "scheduler",
    )
    scheduler_decay_lr: float | None = _p(
        None,
        "learning rate at the end of the decay (held afterwards; equal to optimizer_lr: a constant rate). "
        "None: the family's recipe",
        "scheduler",
    )
    augment_shift: int | None = _p(
        None,
        "random image shift of up to N pixels (at image_size) while training, a cheap augmentation that helps "
        "closed-loop control; 0: off. None: the family's recipe",
    )
    # DiT4DiT-style
    pretrained_checkpoint: str | None = _p(
        None, "start from this policy checkpoint directory (same family and config; None: from scratch)", "dit4dit"
    )
    freeze_modules: str | None = _p(
        None,
        "comma-separated modules not to train, e.g. backbone or backbone.language_encoder (see --list-modules); "
        "'' trains everything; None: the family's own default (its train_defaults: mini freezes its backbone "
        "in the ci profile, the others train everything)",
        "dit4dit",
    )
    resume: bool = _p(False, "continue the run in output_dir from checkpoints/last (exact: same losses)", "dit4dit")
    resume_from: str | None = _p(
        None,
        "resume from this checkpoint instead of last: a name under output_dir/checkpoints (step_000300) or a "
        "path; implies resume=true. Later step_* checkpoints of the run are discarded (runs.rollback forks "
        "instead). None: checkpoints/last",
        "dit4dit",
    )
    keep_final_model: bool = _p(
        False,
        "keep output_dir/final_model (env KEEP_FINAL_MODEL=1 does the same); "
        "by default it is removed after its size is reported",
        "dit4dit",
    )
    # machine
    device: str = _p("auto", "auto, cpu or cuda (under accelerate launch: what accelerate picks)", "machine")
    num_threads: int = _p(0, "torch CPU threads per process (0: torch's default)", "machine")
    precision: str = _p(
        "auto",
        "auto (bf16 autocast on CUDA, fp32 elsewhere: on CPU bf16 was measured slower), fp32, or bf16 "
        "(autocast of the training forward; weights, optimiser and validation stay fp32)",
        "machine",
    )
    torch_compile: bool = _p(
        False,
        "torch.compile the model's training step (the family's compile_targets, else the whole model); the "
        "first steps are slow while it compiles (about a minute on a GPU server, many minutes on a small CPU). "
        "For long GPU runs",
        "machine",
        gpu=True,
    )
    compile_backend: str = _p(
        "inductor",
        "torch.compile backend: inductor (generated kernels, the fast one) or aot_eager (traces the graphs "
        "without generating code: a quick check that the model compiles)",
        "machine",
    )
    pin_memory: bool | None = _p(
        None,
        "page-locked batches for fast, asynchronous copies to the GPU. None: on when training on CUDA",
        "machine",
    )
    progress: bool = _p(True, "show a tqdm progress bar with ETA (on stderr)", "machine")
    system_metrics: bool = _p(
        True, "sample CPU, RAM, disk and GPU use into each metrics.jsonl row (for the live monitor)", "machine"
    )
    # trackers
    tensorboard: bool = _p(
        False,
        "mirror every metrics.jsonl row to TensorBoard event files in output_dir/tensorboard "
        "(`tensorboard --logdir runs`); needs the tensorboard package",
        "trackers",
    )
    wandb: bool = _p(
        False,
        "mirror every metrics.jsonl row to Weights & Biases in offline mode: files in output_dir/wandb, no "
        "account, no network, no key stored; upload later with `wandb sync output_dir/wandb/offline-run-*`. "
        "Needs the wandb package",
        "trackers",
    )
    wandb_project: str = _p("dit4dit-libero", "the W&B project the offline run is synced into later", "trackers")

    def __post_init__(self) -> None:
        if not isinstance(self.policy_config, (type(None), Mapping)) and not dataclasses.is_dataclass(
            self.policy_config
        ):
            raise ConfigError(
                f"policy_config must be a mapping or the family's config, got {type(self.policy_config).__name__}"
            )
        from tutorial_utils import policies
        from tutorial_utils.policies.trainable import make_config

        try:
            fam = policies.family(self.policy)
        except policies.PolicyUnavailable as exc:
            raise ConfigError(f"policy={self.policy!r}: {exc}") from None
        if not isinstance(self.policy_config, fam.config_class):
            self.policy_config = make_config(fam, self.policy_config)
        # a recipe field left None: the family's own value (train_defaults), else the book's recipe
        for name, value in family_recipe(self.policy).items():
            if getattr(self, name) is None:
                setattr(self, name, value)

    @classmethod
    def from_overrides(
        cls, overrides: Mapping[str, Any] | Sequence[str] = (), base: TrainConfig | None = None
    ) -> TrainConfig:
        """A config from ``{name: value}`` or ``["name=value", ...]``; values may be strings."""
        if not isinstance(overrides, Mapping):
            overrides = params.parse_overrides(overrides)
        own: dict[str, Any] = {}
        policy_kv: dict[str, Any] = {}
        seen: dict[str, str] = {}
        family = str(overrides.get("policy", base.policy if base else cls.policy))
        for raw_key, value in overrides.items():
            kind, key = canonical_name(raw_key, family)
            if key in seen and seen[key] != raw_key:
                raise ConfigError(f"parameter {key!r} given twice (as {seen[key]!r} and {raw_key!r}); keep one.")
            seen[key] = raw_key
            (policy_kv if kind == "policy" else own)[key] = value
        start = dataclasses.asdict(base) if base is not None else {}
        start.pop("policy_config", None)
        if base is not None and own.get("policy", base.policy) == base.policy:
            policy_kv = {**dataclasses.asdict(base.policy_config), **policy_kv}
        elif base is not None:  # another family: the base's recipe values that were its family's own go
            for name, value in family_recipe(base.policy).items():
                if _same(start.get(name), value):
                    start.pop(name, None)
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {**start, **{k: params.coerce(cls, k, v, k) for k, v in own.items()}}
        cfg = cls(**{k: v for k, v in values.items() if k in fields and k != "policy_config"}, policy_config=policy_kv)
        cfg.check()
        return cfg

    def check(self) -> None:
        for name in ("batch_size", "steps", "val_samples", "grad_accum_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")
        for name in (
            "eval_freq",
            "log_freq",
            "save_freq",
            "scheduler_warmup_steps",
            "scheduler_decay_steps",
            "num_threads",
            "augment_shift",
            "keep_last",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 0")
        if self.num_workers is not None and self.num_workers < 0:
            raise ConfigError(f"num_workers={self.num_workers} must be >= 0 (None: chosen from the cores)")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ConfigError(f"ema_decay={self.ema_decay} must be in [0, 1) (0.999-0.9999 is typical; 0: off)")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision={self.precision!r}: use {', '.join(PRECISIONS)}")
        if self.compile_backend not in COMPILE_BACKENDS:
            raise ConfigError(f"compile_backend={self.compile_backend!r}: use {', '.join(COMPILE_BACKENDS)}")
        if self.keep_optimizer not in KEEP_OPTIMIZER:
            raise ConfigError(
                f"keep_optimizer={self.keep_optimizer!r}: use {' or '.join(KEEP_OPTIMIZER)} (last: only the newest "
                "step_* checkpoint keeps the optimizer state, so only it can be resumed from)"
            )
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction={self.val_fraction} must be in [0, 1)")
        if self.optimizer_lr <= 0:
            raise ConfigError(f"optimizer_lr={self.optimizer_lr} must be > 0 (1e-5..1e-4 is typical)")
        if self.device not in ("auto", "cpu", "cuda", "mps"):
            raise ConfigError(f"device={self.device!r}: use auto, cpu, cuda or mps")
        check = getattr(self.policy_config, "check", None)
        if callable(check):
            check()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def freeze_list(self) -> list[str]:
        """``freeze_modules`` as a list; None is the family's own default (``train_defaults``)."""
        value = self.freeze_modules
        if value is None:
            from tutorial_utils import policies

            value = policies.family(self.policy).train_default("freeze_modules", "")
        return [m.strip() for m in str(value or "").split(",") if m.strip()]


#: DiT4DiT's override names -> the canonical parameter.
ALIASES: dict[str, str] = {
    "data_mix": "dataset",
    "per_device_batch_size": "batch_size",
    "max_train_steps": "steps",
    "save_interval": "save_freq",
    "eval_interval": "eval_freq",
    "logging_frequency": "log_freq",
    "env_eval_freq": "eval_freq",  # LeRobot >= 0.6's name
    "num_train_steps": "steps",
    "gradient_accumulation_steps": "grad_accum_steps",  # DiT4DiT's and accelerate's name
}
_PREFIXES = ("trainer.", "datasets.vla_data.", "framework.", "optimizer.", "scheduler.")


def _own_names() -> set[str]:
    return {f.name for f in dataclasses.fields(TrainConfig)} - {"policy_config"}


def canonical_name(key: str, family: str = "mini") -> tuple[str, str]:
    """``("train", name)`` for a training parameter, ``("policy", name)`` for a field of the
    family's config; a ConfigError with the closest names for anything else."""
    from tutorial_utils import policies

    names = _own_names()
    try:
        fam_fields = {f.name for f in dataclasses.fields(policies.family(family).config_class)}
    except policies.PolicyUnavailable:
        fam_fields = set()
    k = str(key).strip().lstrip("-").replace("-", "_")
    if k.startswith("policy."):
        k = k[len("policy.") :]
        if k in fam_fields:
            return "policy", k
        raise params.unknown_parameter(
            str(key),
            {f"policy.{n}" for n in fam_fields},
            f"`python -m tutorial_utils train --list-params policy={family}`",
        )
    for pre in _PREFIXES:
        if k.startswith(pre) and k[len(pre) :] in names | set(ALIASES) | fam_fields:
            k = k[len(pre) :]
    k = ALIASES.get(k, k)
    if k in names:
        return "train", k
    if k in fam_fields:
        return "policy", k
    raise params.unknown_parameter(
        str(key),
        names | set(ALIASES) | fam_fields,
        f"`python -m tutorial_utils train --list-params` (aliases: {', '.join(sorted(ALIASES))})",
    )


def parse_overrides(items: Iterable[str]) -> dict[str, str]:
    return params.parse_overrides(items)


def parameters_table(family: str = "mini") -> str:
    """Markdown table of every training parameter and the family's, defaults, aliases, meaning."""
    from tutorial_utils import policies, profiles

    per_profile = {p: family_recipe(family, p) for p in profiles.PROFILES}
    derived = {
        name: f"{family}: " + params.default_text({p: per_profile[p][name] for p in profiles.PROFILES})
        for name in RECIPE
    }
    own = params.markdown_table(TrainConfig, ALIASES, aliases_column=True, derived=derived)
    fam = params.markdown_table(
        policies.family(family).config_class, prefix="policy.", aliases_column=True
    ).splitlines()[2:]
    return "\n".join([own, *fam])
