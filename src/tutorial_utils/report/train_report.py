"""Reading a finished training run for the book: success signs, parameter split, disk usage,
loss curves, and promotion of a run's small real outputs into ``logs/`` and ``assets/``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def smoke_test_signs(parsed: dict[str, Any], steps: int) -> list[dict[str, Any]]:
    """The smoke test's success signs in a parsed ``train.log`` (``logs.parse_train_log``):
    whether each was seen, what it proves and what it does not."""
    logged = {int(s["step"]) for s in parsed.get("steps", [])}
    return [
        {
            "sign": f"Total optimization steps = {steps}",
            "seen": parsed.get("total_steps") == steps,
            "proves": "the step override reached the trainer's configuration",
            "does not prove": "that any step ran",
        },
        {
            "sign": "len(vla_train_dataloader) = N",
            "seen": bool(parsed.get("dataloader_len")),
            "proves": f"the dataset was found and indexed ({parsed.get('dataloader_len')} items at batch size 1 = frames)",
            "does not prove": "that the frames decode or the actions are sensible",
        },
        {
            "sign": "Trainable / Frozen parameters",
            "seen": parsed.get("trainable_params") is not None,
            "proves": "the model was built and freeze_modules applied",
            "does not prove": "that the frozen weights are the pretrained ones you meant",
        },
        *[
            {
                "sign": f"Step {k}, Loss: {{...}}",
                "seen": k in logged,
                "proves": "a batch was loaded, forward + backward ran and the optimiser stepped",
                "does not prove": "convergence: two losses are noise",
            }
            for k in range(1, steps + 1)
        ],
        {
            "sign": "Training complete. Final model saved",
            "seen": parsed.get("final_model") is not None,
            "proves": "the loop ended normally and the final save worked",
            "does not prove": "that the model is any good",
        },
    ]


def plot_parameter_split(counts: dict[str, int], reference: tuple[int, int] = (163_073_544, 10_641_307_643)):
    """Trainable vs frozen share of the mini policy next to the seed's DiT4DiT run."""
    import matplotlib.pyplot as plt

    mini_t, mini_total = counts["trainable"], counts["total"]
    ref_t, ref_total = reference
    fig, ax = plt.subplots(figsize=(7, 2.3))
    rows = [
        ("DiT4DiT smoke test\n(10.6 B parameters)", ref_t / ref_total),
        (f"mini policy\n({mini_total / 1e6:.2f} M parameters)", mini_t / mini_total),
    ]
    for i, (_label, share) in enumerate(rows):
        ax.barh(i, share * 100, color="#4c9f70")
        ax.barh(i, 100 - share * 100, left=share * 100, color="#c9ced6")
        ax.text(min(share * 100 + 1, 90), i, f"{share * 100:.2f}% trainable", va="center", fontsize=9)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of parameters (green: trainable, grey: frozen)")
    fig.tight_layout()
    return fig


def disk_usage(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Size of each top-level entry of a run directory (symlinks not followed)."""
    from tutorial_utils.io import dir_size, human_bytes

    rows = []
    for p in sorted(q for q in Path(run_dir).iterdir() if not q.name.startswith(".")):
        size = p.lstat().st_size if p.is_symlink() or p.is_file() else dir_size(p)
        rows.append(
            {
                "entry": p.name + ("/" if p.is_dir() and not p.is_symlink() else ""),
                "bytes": size,
                "size": human_bytes(size),
            }
        )
    return rows


def plot_losses(rows: list[dict[str, Any]], title: str = "training"):
    """Loss (and validation action error, when logged) against the step."""
    import matplotlib.pyplot as plt

    tr = [r for r in rows if "loss" in r]
    va = [r for r in rows if "val_action_mae" in r]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(
        [r["step"] for r in tr],
        [r.get("loss_mean", r["loss"]) for r in tr],
        label="flow-matching loss",
        color="#1f4e79",
    )
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    if va:
        ax2 = ax.twinx()
        ax2.plot(
            [r["step"] for r in va],
            [r["val_action_mae"] for r in va],
            "o-",
            color="#d1495b",
            label="validation action error",
        )
        ax2.set_ylabel("validation action MAE (normalised)")
        ax2.legend(loc="upper right", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    return fig
