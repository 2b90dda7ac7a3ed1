"""SmolVLA (LeRobot 0.4.4's ``smolvla``) behind the policy seam, and the local stand-in VLM that lets
its code build, train, save, load and serve on this machine.

The real SmolVLA is SmolVLM2-500M (its first 16 layers) plus a flow-matching action expert,
fine-tuned from ``lerobot/smolvla_base``: Hub weights, 450M parameters, a GPU-server job
(its ``gpu_recipe``, :data:`tutorial_utils.policies.lerobot.SMOLVLA_RECIPE`). Asked for that VLM, :class:`SmolVLAPolicy`
raises :class:`PolicyUnavailable` with the recipe, as before.

Asked for a local directory instead (``vlm_model_name=<dir>``), it builds LeRobot's own
SmolVLA on it: :func:`write_standin` writes such a directory, a **stand-in**, said plainly
everywhere it appears. It has SmolVLM's architecture and file layout (a ``smolvlm`` config.json, a
SmolVLMProcessor with its image processor and a tokenizer carrying SmolVLM's special image tokens)
at toy size: a 2-layer Llama text model of width 64, a 1-layer SigLIP-style vision encoder, a
word-level tokenizer over the dataset's task instructions, and random weights. Nothing it predicts
means anything; what it proves is that LeRobot's SmolVLA code runs end to end through this project's
adapter, trainer, checkpoints and websocket server (``python -m tutorial_utils zoo smolvla-smoke``).

SmolVLA needs transformers 4.57 (LeRobot's pin <5), which needs huggingface_hub<1.0, while this project
runs huggingface_hub 2.x: ``make setup`` installs that pair into ``.smolvla/`` beside the venv
(requirements-smolvla.txt), and only a process started with :func:`environment` sees it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tutorial_utils import paths
from tutorial_utils.errors import ConfigError
from tutorial_utils.params import param
from tutorial_utils.policies.base import PolicyUnavailable
from tutorial_utils.policies.lerobot import SMOLVLA_RECIPE, LeRobotPolicy

#: the folder make setup installs requirements-smolvla.txt into (transformers 4.57 + huggingface_hub 0.35)
ENV_DIR = paths.REPO / ".smolvla"
#: the VLM the real SmolVLA is built on (LeRobot 0.4.4's default vlm_model_name)
HUB_VLM = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"
#: the marker file a stand-in directory carries (what it is, its sizes, the tasks its vocabulary covers)
STANDIN_FILE = "STANDIN.json"
#: transformers versions LeRobot 0.4.4's smolvla extra accepts
TRANSFORMERS_SPEC = ">=4.57.1,<5"
SMOKE_COMMAND = "python -m tutorial_utils zoo smolvla-smoke"
#: SmolVLM's special tokens (the processor reads them from the tokenizer by these names)
SPECIAL_TOKENS = {
    "fake_image_token": "<fake_token_around_image>",
    "image_token": "<image>",
    "global_image_token": "<global-img>",
    "end_of_utterance_token": "<end_of_utterance>",
}


def environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``.smolvla`` first on PYTHONPATH, for a
    process that imports SmolVLA; raises :class:`PolicyUnavailable` when it is not installed."""
    if not (ENV_DIR / "transformers").is_dir():
        raise PolicyUnavailable(
            f"{ENV_DIR} is missing: SmolVLA's transformers 4.57 and huggingface_hub 0.35 live there, beside the "
            "venv. Install them with `make setup` (or `.venv/bin/python -m pip install --no-deps --target .smolvla "
            "-r requirements-smolvla.txt`)."
        )
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ENV_DIR), env.get("PYTHONPATH", "")) if p)
    return env


def transformers_problem() -> str | None:
    """None when this process can import a transformers SmolVLA accepts; otherwise why not and the fix."""
    fix = f"run it in the SmolVLA environment: `{SMOKE_COMMAND}` starts one (PYTHONPATH={ENV_DIR.name})"
    try:
        import transformers
    except Exception as exc:  # noqa: BLE001 - 4.57 beside huggingface_hub 2.x raises ImportError or worse
        return f"transformers does not import here ({type(exc).__name__}: {str(exc)[:160]}); {fix}"
    from packaging.specifiers import SpecifierSet

    if transformers.__version__ not in SpecifierSet(TRANSFORMERS_SPEC):
        return f"transformers {transformers.__version__} is installed, LeRobot 0.4.4's SmolVLA needs {TRANSFORMERS_SPEC}; {fix}"
    return None


def is_standin(vlm: str | os.PathLike) -> bool:
    return (Path(vlm) / STANDIN_FILE).is_file()


def write_standin(
    directory: str | os.PathLike, tasks: Iterable[str], image_size: int = 128, width: int = 64, layers: int = 2
) -> Path:
    """Write a stand-in SmolVLM into ``directory`` (see the module docstring): config.json, the
    processor (image processor sized ``image_size``, patch 16, no image splitting) and a word-level
    tokenizer whose vocabulary is ``tasks``' words plus SmolVLM's chat and image tokens. Needs the
    SmolVLA environment (transformers 4.57)."""
    if image_size < 32 or image_size % 32:
        raise ConfigError(
            f"image_size={image_size}: the stand-in's vision encoder cuts 16 px patches and merges them 2x2, so the "
            "image size must be a multiple of 32 (the recorded datasets use 128)"
        )
    problem = transformers_problem()
    if problem:
        raise PolicyUnavailable(f"the SmolVLA stand-in cannot be written: {problem}")
    from tutorial_utils.policies._torchvision import ensure_importable

    ensure_importable()  # the SmolVLM video processor imports torchvision
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, SmolVLMConfig, SmolVLMImageProcessor, SmolVLMProcessor
    from transformers.models.smolvlm.video_processing_smolvlm import SmolVLMVideoProcessor

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tasks = sorted({str(t) for t in tasks})
    special = ["<pad>", "<unk>", "<|im_start|>", *SPECIAL_TOKENS.values(), "<video>"]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([*tasks, "User: Assistant:"], trainers.WordLevelTrainer(special_tokens=special))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", extra_special_tokens=SPECIAL_TOKENS
    )
    patches = (image_size // 16) ** 2
    images = SmolVLMImageProcessor(
        do_image_splitting=False, size={"longest_edge": image_size}, max_image_size={"longest_edge": image_size}
    )
    SmolVLMProcessor(
        image_processor=images, tokenizer=tokenizer, video_processor=SmolVLMVideoProcessor(), image_seq_len=patches // 4
    ).save_pretrained(out)
    heads = max(1, width // 16)
    config = SmolVLMConfig(
        text_config={
            "model_type": "llama",
            "hidden_size": width,
            "intermediate_size": 2 * width,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": max(1, heads // 2),
            "head_dim": 16,
            "vocab_size": len(tokenizer),
            "max_position_embeddings": 1024,
        },
        vision_config={
            "hidden_size": width // 2,
            "intermediate_size": width,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": image_size,
            "patch_size": 16,
        },
        scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS["image_token"]),
        vocab_size=len(tokenizer),
    )
    config.save_pretrained(out)
    (out / STANDIN_FILE).write_text(
        json.dumps(
            {
                "what": "a stand-in for HuggingFaceTB/SmolVLM2-500M-Video-Instruct: SmolVLM's architecture and files at "
                "toy size, random weights, a word-level tokenizer over the tasks below; for smoke tests, not for "
                "control",
                "stands_in_for": HUB_VLM,
                "image_size": image_size,
                "text_width": width,
                "text_layers": layers,
                "vocabulary": len(tokenizer),
                "tasks": tasks,
            },
            indent=1,
        )
        + "\n"
    )
    return out


@dataclass
class SmolVLAConfig:
    """SmolVLA: SmolVLM2 (its first layers) + a flow-matching action expert (LeRobot 0.4.4 names)."""

    image_size: int = param(512, "images are resized with padding to this square size (LeRobot: 512)", "model")
    chunk_size: int = param(50, "actions predicted per chunk (LeRobot: 50)", "model")
    n_action_steps: int = param(50, "actions executed per chunk (LeRobot: 50)", "model")
    tokenizer_max_length: int = param(
        48, "longest tokenized instruction (the guide's max_input_seq_len; LeRobot: 48)", "model"
    )
    num_steps: int = param(10, "flow-matching denoising steps at inference (LeRobot: 10)", "model")
    freeze_vision_encoder: bool = param(
        True, "keep the VLM's vision encoder frozen (guide: freeze_vision_encoder; LeRobot: True)", "model"
    )
    train_expert_only: bool = param(
        True, "train only the action expert and projections, the VLM frozen (LeRobot: True)", "model"
    )
    pretrained_path: str = param("lerobot/smolvla_base", "the Hub weights fine-tuning starts from", "model")
    vlm_model_name: str = param(
        HUB_VLM,
        "the VLM: the Hub id (a GPU server) or a local stand-in directory (tutorial_utils.policies.smolvla.write_standin)",
        "model",
    )

    @property
    def action_horizon(self) -> int:
        return self.chunk_size

    def check(self) -> None:
        if self.n_action_steps > self.chunk_size:
            raise ConfigError(
                f"n_action_steps={self.n_action_steps} > chunk_size={self.chunk_size}: a chunk cannot execute more "
                "actions than it predicts"
            )

    def lerobot_kwargs(self) -> dict:
        s = int(self.image_size)
        return {
            "vlm_model_name": str(self.vlm_model_name),
            "load_vlm_weights": False,  # a stand-in has none; the Hub VLM's come with pretrained_path on a GPU server
            "resize_imgs_with_padding": (s, s),
            "chunk_size": int(self.chunk_size),
            "n_action_steps": int(self.n_action_steps),
            "tokenizer_max_length": int(self.tokenizer_max_length),
            "num_steps": int(self.num_steps),
            "freeze_vision_encoder": bool(self.freeze_vision_encoder),
            "train_expert_only": bool(self.train_expert_only),
        }


class SmolVLAPolicy(LeRobotPolicy):
    """LeRobot's SmolVLA on a local stand-in VLM; on the Hub VLM, the GPU-server recipe as an error."""

    name = "smolvla"
    config_class = SmolVLAConfig
    lerobot_type = "smolvla"
    #: its real weights need a GPU server: not in ``policies.trainable()``, the zoo or the serving registry
    needs_gpu_server: ClassVar[bool] = True
    gpu_recipe = SMOLVLA_RECIPE
    catalog = {
        "group": "vision-language-action",
        "scenario": "follow spoken instructions (tidy the table), with a GPU",
        "here": "GPU server for its Hub weights (the error names the recipe); LeRobot's code runs here on a local "
        "stand-in VLM with random weights (zoo smolvla-smoke: trained a few steps, reloaded, served)",
    }

    @classmethod
    def recipe(cls) -> str:
        return (
            cls.gpu_recipe.message(cls.name)
            + f" Its code runs here on a stand-in VLM (random weights, for a smoke test): `{SMOKE_COMMAND}`."
        )

    def __init__(self, cfg: Any = None, statistics: Mapping[str, Any] | None = None):
        cfg = cfg or self.config_class()
        if not is_standin(cfg.vlm_model_name):
            raise PolicyUnavailable(self.recipe())
        problem = transformers_problem()
        if problem:
            raise PolicyUnavailable(f"policy 'smolvla' on the stand-in {cfg.vlm_model_name}: {problem}")
        super().__init__(cfg, statistics)
