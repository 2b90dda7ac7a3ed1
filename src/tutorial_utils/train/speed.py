"""What makes the training loop feed a GPU: the loader's worker count and pinned memory, bf16
autocast, a compiled step, batches moved to the device before the model sees them, and the
exponential moving average of the weights (:class:`EMA`).

Each piece is a :class:`~tutorial_utils.train.config.TrainConfig` parameter (``num_workers``,
``pin_memory``, ``precision``, ``torch_compile``, ``grad_accum_steps``, ``ema_decay``);
:func:`resolve` turns the ``auto``/``None`` ones into what this process uses, and the run records
that in ``train_config.json`` (``resolved``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass
from typing import Any

from tutorial_utils.errors import ConfigError

#: ``num_workers=None`` never starts more than this many loader processes per training process.
MAX_AUTO_WORKERS = 8


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def auto_workers(cores: int | None = None, processes: int = 1) -> int:
    """Loader workers for one of ``processes`` training processes on a machine with ``cores``:
    the cores are shared among the processes, one of each share runs the training process itself,
    the rest load data; at least 1 (loading beside the step is never slower than in it), at most
    :data:`MAX_AUTO_WORKERS`."""
    cores = usable_cores() if cores is None else int(cores)
    share = max(1, cores // max(1, int(processes)))
    return max(1, min(MAX_AUTO_WORKERS, share - 1))


@dataclass
class Resolved:
    """What ``auto``/``None`` parameters became in this process."""

    device: str
    num_workers: int
    pin_memory: bool
    precision: str  # "bf16" or "fp32"
    compile: bool
    grad_accum_steps: int
    ema_decay: float

    def to_dict(self) -> dict:
        return asdict(self)


def resolve(cfg, device_type: str, processes: int = 1) -> Resolved:
    """``cfg``'s speed settings for a process training on ``device_type`` (cpu, cuda, mps)."""
    cuda = device_type == "cuda"
    workers = auto_workers(processes=processes) if cfg.num_workers is None else int(cfg.num_workers)
    pin = cuda if cfg.pin_memory is None else bool(cfg.pin_memory) and cuda
    precision = "bf16" if cfg.precision == "bf16" or (cfg.precision == "auto" and cuda) else "fp32"
    return Resolved(
        device_type, workers, pin, precision, bool(cfg.torch_compile), int(cfg.grad_accum_steps), cfg.ema_decay
    )


def autocast(device_type: str, precision: str):
    """bf16 autocast on ``device_type`` for the training forward, or nothing for fp32."""
    if precision != "bf16":
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device_type=device_type, dtype=torch.bfloat16)


def compile_policy(policy, backend: str = "inductor") -> list[str]:
    """Compile the family's ``compile_targets`` (submodules whose ``forward`` takes only tensors,
    so the graphs have no breaks) in place, or the whole model when it names none. In place
    (``nn.Module.compile``): the state dict, checkpoints and ``predict`` keep their names. Returns
    what was compiled."""
    targets = tuple(getattr(policy, "compile_targets", ()) or ())
    modules = dict(policy.named_modules())
    missing = [t for t in targets if t not in modules]
    if missing:
        raise ValueError(f"{type(policy).__name__}.compile_targets names unknown modules {missing}")
    for name in targets or ("",):
        modules[name].compile(backend=backend)
    return list(targets) or ["(the whole model)"]


def to_device(batch: dict, device, non_blocking: bool = False) -> dict:
    """The batch's tensors on ``device`` (the task strings stay a list); ``non_blocking`` copies
    from pinned memory overlap with the GPU's work."""
    import torch

    return {k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class EMA:
    """An exponential moving average of the trainable parameters, updated after each optimiser
    step with ``decay_t = min(decay, (1 + t) / (10 + t))`` (t: optimiser steps so far), so the first
    steps do not pin the average to the random initial weights. :meth:`applied` swaps the average
    into the model for validation and saving, and puts the raw weights back afterwards. The state
    (:meth:`state_dict`) goes into ``training_state.pt``, so a resumed run continues the same
    average."""

    def __init__(self, model, decay: float):
        import torch

        self.decay = float(decay)
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        params = dict(model.named_parameters())
        self.shadow = [params[n].detach().clone().float() for n in self.names]
        self.updates = 0
        self._torch = torch

    def _params(self, model) -> list:
        params = dict(model.named_parameters())
        return [params[n] for n in self.names]

    def current_decay(self) -> float:
        t = self.updates
        return min(self.decay, (1.0 + t) / (10.0 + t))

    def update(self, model) -> None:
        torch = self._torch
        d = self.current_decay()
        with torch.no_grad():
            live = [p.detach().float() for p in self._params(model)]
            torch._foreach_lerp_(self.shadow, live, 1.0 - d)
        self.updates += 1

    @contextlib.contextmanager
    def applied(self, model):
        """Within the block the model holds the averaged weights; the raw ones come back after."""
        torch = self._torch
        params = self._params(model)
        with torch.no_grad():
            raw = [p.detach().clone() for p in params]
            for p, s in zip(params, self.shadow):
                p.copy_(s)
        try:
            yield model
        finally:
            with torch.no_grad():
                for p, r in zip(params, raw):
                    p.copy_(r)

    def raw_weights(self, model) -> dict[str, Any]:
        """The model's raw (not averaged) trainable weights, for ``training_state.pt``."""
        return {n: p.detach().cpu().clone() for n, p in zip(self.names, self._params(model))}

    def state_dict(self) -> dict:
        return {
            "decay": self.decay,
            "updates": self.updates,
            "shadow": {n: s.detach().cpu().clone() for n, s in zip(self.names, self.shadow)},
        }

    def load_state_dict(self, state: dict, model) -> None:
        """Continue a saved average; the raw weights of the checkpoint go back into ``model``."""
        shadow = state["shadow"]
        missing = [n for n in self.names if n not in shadow]
        if missing:
            raise KeyError(f"the checkpoint's EMA lacks {missing[:3]} ({len(missing)} tensors)")
        dev = self.shadow[0].device if self.shadow else "cpu"
        self.shadow = [shadow[n].to(dev).float().clone() for n in self.names]
        self.updates = int(state["updates"])


def steady_throughput(rows: list[dict], step_samples: int, warmup_steps: int = 0) -> dict:
    """Samples/s, ms per optimisation step and the data-wait share of a run, from its
    ``metrics.jsonl`` training rows, leaving out the rows up to ``warmup_steps`` (worker start-up,
    compilation, first decodes). Each row covers the steps since the previous one;
    ``step_samples``: samples per optimisation step over all processes. Also the wall time of the
    steady rows (``steady_s``) and of the warm-up (``warmup_s``)."""
    train_rows = [r for r in rows if "loss" in r and r.get("samples_per_s")]
    prev, spans = 0, []
    for r in train_rows:
        n = int(r["step"]) - prev
        prev = int(r["step"])
        seconds = n * step_samples / float(r["samples_per_s"])
        spans.append((int(r["step"]), n, seconds, seconds * float(r["data_wait_share"]), r.get("time")))
    steady = [s for s in spans if s[0] > warmup_steps]
    if not steady:
        raise ValueError(f"no training rows after the {warmup_steps} warm-up steps (rows: {len(train_rows)})")
    steps = sum(s[1] for s in steady)
    seconds = sum(s[2] for s in steady)
    return {
        "samples_per_s": steps * step_samples / seconds,
        "ms_per_step": 1000.0 * seconds / steps,
        "data_wait_share": sum(s[3] for s in steady) / seconds,
        "steady_steps": steps,
        "steady_s": seconds,
        "warmup_s": sum(s[2] for s in spans if s[0] <= warmup_steps),
        # wall-clock window of the steady rows (for matching GPU samples): from the end of the warm-up
        "window": (
            next((s[4] for s in reversed(spans) if s[0] <= warmup_steps), None) or steady[0][4],
            steady[-1][4],
        ),
    }


def budget_steps(s_per_step: float, minutes: float, lo: int = 20, hi: int = 200_000) -> int:
    """Training steps that fill ``minutes`` at ``s_per_step`` (at least ``lo``, at most ``hi``)."""
    if minutes <= 0 or s_per_step <= 0:
        raise ConfigError(f"budget: train_minutes={minutes} and the step time {s_per_step} s must be > 0")
    return int(max(lo, min(hi, round(60.0 * minutes / s_per_step))))
