"""An upstream DiT4DiT checkout: is it complete, and does it still say what the bridge relies on?

:func:`validate_checkout` checks that every file the bridge runs, reads or patches is there and
names the missing ones. :func:`contract_check` greps the checkout for every flag, config key,
mixture name and log line the bridge and the diagnosis rely on (docs/FACTS.md section 11, upstream
``0362b34``) and reports the drift: what is missing and where it was expected. Nothing in the
checkout is imported or changed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from tutorial_utils.errors import TutorialError

TRAIN_PY = "DiT4DiT/training/train.py"
LIBERO_YAML = "DiT4DiT/config/libero/dit4dit_libero.yaml"
DEEPSPEED_YAML = "DiT4DiT/config/deepseeds/deepspeed_zero2.yaml"
DS_CONFIG_YAML = "DiT4DiT/config/deepseeds/ds_config.yaml"
MIXTURES_PY = "DiT4DiT/dataloader/gr00t_lerobot/mixtures.py"
MIXTURES_MODULE = "DiT4DiT.dataloader.gr00t_lerobot.mixtures"
LEROBOT_DATASETS_PY = "DiT4DiT/dataloader/lerobot_datasets.py"
DATASETS_PY = "DiT4DiT/dataloader/gr00t_lerobot/datasets.py"
DATA_CONFIG_PY = "DiT4DiT/dataloader/gr00t_lerobot/data_config.py"
SHARE_TOOLS_PY = "DiT4DiT/model/framework/share_tools.py"
FRAMEWORK_INIT_PY = "DiT4DiT/model/framework/__init__.py"
OVERWATCH_PY = "DiT4DiT/training/trainer_utils/overwatch.py"
SERVER_PY = "deployment/model_server/server_policy.py"
WS_CLIENT_PY = "deployment/model_server/tools/websocket_policy_client.py"
EVAL_PY = "examples/LIBERO/eval_files/eval_libero.py"
INTERFACE_PY = "examples/LIBERO/eval_files/model2libero_interface.py"
MODALITY_JSON = "examples/LIBERO/train_files/modality.json"
#: The client's entry point and its one parameter: tyro makes every flag ``--<param>.<field-with-dashes>``
#: from that parameter's name (``eval_libero(args: Args)`` -> ``--args.task-suite-name``).
#: The official recipe's flow-matching overrides (upstream ``examples/LIBERO/train_files/run_libero.sh``),
#: where the YAML has logit_normal with 0.05/0.98: longer runs carry them, the smoke test does not need them.
RECIPE_OVERRIDES = (
    ("framework.cosmos25.flow_matching.time_distribution", "uniform"),
    ("framework.cosmos25.flow_matching.high_sigma_ratio", "null"),
    ("framework.cosmos25.flow_matching.high_sigma_min", "null"),
)
CLIENT_FUNCTION = "eval_libero"
CLIENT_ARGS_PARAM = "args"


def client_flag(field_name: str) -> str:
    """Upstream's client flag for one ``Args`` field: ``task_suite_name`` -> ``--args.task-suite-name``."""
    return f"--{CLIENT_ARGS_PARAM}.{field_name.replace('_', '-')}"


#: Every file the bridge uses, and what for.
REQUIRED_FILES: dict[str, str] = {
    TRAIN_PY: "the training entry point (run by accelerate through the mixture launcher)",
    LIBERO_YAML: "the LIBERO training config (--config_yaml)",
    DEEPSPEED_YAML: "accelerate's --config_file (DeepSpeed ZeRO-2)",
    DS_CONFIG_YAML: "read by train.py at import, relative to the checkout root",
    MIXTURES_PY: "DATASET_NAMED_MIXTURES, which the launcher extends in memory",
    LEROBOT_DATASETS_PY: "looks the data_mix up in DATASET_NAMED_MIXTURES",
    DATASETS_PY: "the dataset loader that asserts meta/modality.json",
    SHARE_TOOLS_PY: "reads config.yaml and dataset_statistics.json beside a checkpoint",
    SERVER_PY: "the websocket policy server",
    WS_CLIENT_PY: "the client's websocket connection (the Python 3.8 patch edits it)",
    EVAL_PY: "the LIBERO evaluation client",
    INTERFACE_PY: "the client's model interface (the Python 3.8 patch edits it)",
    MODALITY_JSON: "upstream's LIBERO modality.json (compared with the one the bridge writes)",
}


class CheckoutError(TutorialError, FileNotFoundError):
    """The checkout is missing, incomplete or not a DiT4DiT checkout."""


def validate_checkout(path: str | os.PathLike) -> Path:
    """The checkout's absolute path, once every file in :data:`REQUIRED_FILES` is there.

    Raises :class:`CheckoutError` naming each missing file and what the bridge needs it for.
    """
    root = Path(path).expanduser()
    if not str(path) or not root.is_dir():
        raise CheckoutError(
            f"DiT4DiT checkout {str(path)!r} is not a directory. Fix: `git clone "
            "https://github.com/Mondo-Robotics/DiT4DiT` and pass its folder (the one holding DiT4DiT/, "
            "deployment/, examples/) as `checkout`."
        )
    missing = [rel for rel in REQUIRED_FILES if not (root / rel).is_file()]
    if missing:
        lines = "".join(f"\n  - {rel}: {REQUIRED_FILES[rel]}" for rel in missing)
        raise CheckoutError(
            f"{root}: not a complete DiT4DiT checkout, missing {missing[0]}"
            + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
            + f":{lines}\nFix: pass the checkout root (it holds DiT4DiT/, deployment/ and examples/), or "
            "re-clone it (`git clone https://github.com/Mondo-Robotics/DiT4DiT`; the bridge was checked "
            "against commit 0362b34)."
        )
    return root.resolve()


# --- the contract ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contract:
    """One thing the bridge relies on: ``needle`` in ``file`` (``kind``: ``text``, ``regex`` or
    ``yaml_key``, a dotted key path that must exist in the YAML file)."""

    file: str
    needle: str
    why: str
    kind: str = "text"


def _c(file: str, needle: str, why: str, kind: str = "text") -> Contract:
    return Contract(file, needle, why, kind)


#: Every flag, key and string the bridge's commands, launcher, file fix-ups and the diagnosis use.
CONTRACTS: tuple[Contract, ...] = (
    # training: argv, config keys, mixture registration
    _c(TRAIN_PY, "--config_yaml", "the train command passes --config_yaml"),
    _c(TRAIN_PY, "parse_known_args", "the other --a.b flags reach OmegaConf as a dotlist"),
    _c(TRAIN_PY, "from_dotlist", "--a.b v overrides become a.b=v"),
    _c(TRAIN_PY, DS_CONFIG_YAML, "train.py reads the DeepSpeed config relative to the checkout root (cwd)"),
    _c(LIBERO_YAML, "framework.cosmos25.base_model", "--framework.cosmos25.base_model", "yaml_key"),
    _c(LIBERO_YAML, "datasets.vla_data.data_root_dir", "--datasets.vla_data.data_root_dir", "yaml_key"),
    _c(LIBERO_YAML, "datasets.vla_data.data_mix", "--datasets.vla_data.data_mix", "yaml_key"),
    _c(LIBERO_YAML, "datasets.vla_data.per_device_batch_size", "--datasets.vla_data.per_device_batch_size", "yaml_key"),
    _c(TRAIN_PY, '"pretrained_checkpoint"', "--trainer.pretrained_checkpoint (read with getattr, not in the YAML)"),
    _c(LIBERO_YAML, "trainer.freeze_modules", "--trainer.freeze_modules", "yaml_key"),
    _c(LIBERO_YAML, "trainer.max_train_steps", "--trainer.max_train_steps", "yaml_key"),
    _c(LIBERO_YAML, "trainer.logging_frequency", "--trainer.logging_frequency", "yaml_key"),
    *(
        _c(LIBERO_YAML, key, f"the official recipe's override --{key} (longer runs)", "yaml_key")
        for key, _ in RECIPE_OVERRIDES
    ),
    _c(LIBERO_YAML, "run_root_dir", "--run_root_dir", "yaml_key"),
    _c(LIBERO_YAML, "run_id", "--run_id", "yaml_key"),
    _c(MIXTURES_PY, "DATASET_NAMED_MIXTURES", "the launcher adds one entry to this dict in memory"),
    _c(
        LEROBOT_DATASETS_PY,
        r"from DiT4DiT\.dataloader\.gr00t_lerobot\.mixtures import DATASET_NAMED_MIXTURES",
        "the loader shares the launcher's dict object (an import by name, not a copy)",
        "regex",
    ),
    _c(LEROBOT_DATASETS_PY, "DATASET_NAMED_MIXTURES[data_mix]", "an unknown mixture raises KeyError: '<name>'"),
    _c(DATA_CONFIG_PY, "libero_franka", "the robot config of the registered mixture entry"),
    _c(DATASETS_PY, "meta/modality.json", "the bridge writes meta/modality.json into the dataset"),
    _c(DATASETS_PY, "Please provide a", "the modality assertion the diagnosis reads"),
    # training log lines (diagnosis and success signs)
    _c(TRAIN_PY, "Total parameters", "success sign 'parameters counted'"),
    _c(TRAIN_PY, "Total optimization steps", "the diagnosis' stage order"),
    _c(TRAIN_PY, "len(vla_train_dataloader)", "the diagnosis' stage order"),
    _c(TRAIN_PY, "[Exp: ", "success sign 'first loss line'"),
    _c(TRAIN_PY, r"Step \{.*\}, Loss: ", "the loss line format", "regex"),
    _c(TRAIN_PY, "Training complete. Final model saved at", "success sign 'training complete'"),
    _c(TRAIN_PY, "final_model", "the final model folder the bridge serves or cleans up"),
    _c(OVERWATCH_PY, "rich.logging.RichHandler", "upstream logs through Rich (the diagnosis normalises it)"),
    _c(FRAMEWORK_INIT_PY, "Failed to auto-import framework submodules", "the hidden framework import error"),
    # serving
    _c(SERVER_PY, "--ckpt_path", "the serve command passes --ckpt_path"),
    _c(SERVER_PY, "--port", "the serve command passes --port"),
    _c(SERVER_PY, "--use_bf16", "the serve command may pass --use_bf16"),
    _c(SERVER_PY, "--idle_timeout", "the serve command passes --idle_timeout"),
    _c(SERVER_PY, "server running", "success sign 'server running'"),
    _c(SHARE_TOOLS_PY, r"Missing `?config\.yaml`? for", "the missing config.yaml error", "regex"),
    _c(SHARE_TOOLS_PY, "dataset_statistics.json", "the server reads dataset_statistics.json beside config.yaml"),
    _c(SHARE_TOOLS_PY, "parents[1]", "config.yaml is looked up at <pt>.parents[1]"),
    # evaluation client (tyro: field task_suite_name is --args.task-suite-name)
    _c(EVAL_PY, "tyro", "the client's flags are tyro's --args.<field-with-dashes>"),
    _c(
        EVAL_PY,
        rf"def\s+{CLIENT_FUNCTION}\s*\(\s*{CLIENT_ARGS_PARAM}\s*:",
        f"tyro names every flag after this parameter: --{CLIENT_ARGS_PARAM}.<field>",
        "regex",
    ),
    _c(
        EVAL_PY,
        rf"tyro\.cli\(\s*{CLIENT_FUNCTION}\s*\)",
        f"tyro builds the flags from {CLIENT_FUNCTION}'s signature",
        "regex",
    ),
    _c(EVAL_PY, r"\bhost\s*:", "--args.host", "regex"),
    _c(EVAL_PY, r"\bport\s*:", "--args.port", "regex"),
    _c(EVAL_PY, r"\btask_suite_name\s*:", "--args.task-suite-name", "regex"),
    _c(EVAL_PY, r"\bnum_trials_per_task\s*:", "--args.num-trials-per-task", "regex"),
    _c(EVAL_PY, r"\bvideo_out_path\s*:", "--args.video-out-path", "regex"),
    _c(EVAL_PY, r"\bpretrained_path\s*:", "--args.pretrained-path", "regex"),
    _c(EVAL_PY, "np.ndarray | float", "the Python 3.8 patch adds `from __future__ import annotations`"),
    _c(INTERFACE_PY, "list[int]", "the Python 3.8 patch adds `from __future__ import annotations`"),
    _c(WS_CLIENT_PY, "Failed to connect to server within", "the client connect timeout the diagnosis reads"),
    _c(WS_CLIENT_PY, "Error in inference server", "the server error the diagnosis reads"),
    _c(WS_CLIENT_PY, "ping_interval", "the Python 3.8 patch drops it for websockets 13.1"),
    _c(
        MODALITY_JSON, "", "the modality.json the bridge writes (data.modality's libero preset), key by key", "modality"
    ),
)


@dataclass
class Drift:
    file: str
    expected: str
    why: str
    problem: str  # "file missing", "not found", "key missing", "unreadable"


@dataclass
class ContractReport:
    checkout: str
    checked: int
    drift: list[Drift] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.drift

    def to_dict(self) -> dict:
        return {
            "checkout": self.checkout,
            "checked": self.checked,
            "ok": self.ok,
            "drift": [d.__dict__ for d in self.drift],
        }

    def __str__(self) -> str:
        head = f"contract check of {self.checkout}: {self.checked} expectations, {len(self.drift)} drifted"
        if self.ok:
            return head + "\nOK: every flag, key and log line the bridge relies on is there."
        lines = [head]
        lines += [f"  - {d.file}: {d.problem}: {d.expected!r} ({d.why})" for d in self.drift]
        lines.append(
            "Fix: the checkout differs from upstream 0362b34, which the bridge was checked against. Check out "
            "that commit, or update the bridge's commands (tutorial_utils.bridge) to the new names."
        )
        return "\n".join(lines)


def yaml_key_exists(data: object, dotted: str) -> bool:
    node = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _flatten(node: object, prefix: str = "") -> dict[str, object]:
    if isinstance(node, dict) and node:
        out: dict[str, object] = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: node}


def modality_differences(upstream_text: str) -> list[tuple[str, str]]:
    """``[(key, problem)]`` between upstream's ``modality.json`` and the one the bridge writes
    (:data:`tutorial_utils.data.modality.LIBERO_MODALITY`), compared key by key (dotted paths)."""
    import json

    from tutorial_utils.data.modality import LIBERO_MODALITY

    try:
        theirs = _flatten(json.loads(upstream_text))
    except json.JSONDecodeError as exc:
        return [("(the whole file)", f"unreadable JSON ({exc})")]
    ours = _flatten(LIBERO_MODALITY)
    out = []
    for key in sorted(set(theirs) | set(ours)):
        if key not in ours:
            out.append((key, f"upstream has it ({theirs[key]!r}), the bridge's modality.json does not"))
        elif key not in theirs:
            out.append((key, f"the bridge writes it ({ours[key]!r}), upstream's modality.json does not have it"))
        elif theirs[key] != ours[key]:
            out.append((key, f"upstream {theirs[key]!r}, the bridge writes {ours[key]!r}"))
    return out


def contract_check(path: str | os.PathLike) -> ContractReport:
    """Grep the checkout for every :data:`CONTRACTS` entry; the report lists what drifted."""
    import yaml

    root = Path(path).expanduser()
    if not root.is_dir():
        raise CheckoutError(f"DiT4DiT checkout {str(path)!r} is not a directory. Fix: pass the checkout root.")
    report = ContractReport(str(root), len(CONTRACTS))
    texts: dict[str, str | None] = {}
    parsed: dict[str, object] = {}
    for c in CONTRACTS:
        if c.file not in texts:
            p = root / c.file
            texts[c.file] = p.read_text(encoding="utf-8", errors="replace") if p.is_file() else None
        text = texts[c.file]
        if text is None:
            report.drift.append(Drift(c.file, c.needle, c.why, "file missing"))
            continue
        if c.kind == "yaml_key":
            if c.file not in parsed:
                try:
                    parsed[c.file] = yaml.safe_load(text)
                except yaml.YAMLError as exc:
                    parsed[c.file] = exc
            data = parsed[c.file]
            if isinstance(data, yaml.YAMLError):
                report.drift.append(Drift(c.file, c.needle, c.why, f"unreadable YAML ({str(data).splitlines()[0]})"))
            elif not yaml_key_exists(data, c.needle):
                report.drift.append(Drift(c.file, c.needle, c.why, "key missing"))
            continue
        if c.kind == "modality":
            for key, problem in modality_differences(text):
                report.drift.append(Drift(c.file, key, c.why, problem))
            continue
        found = re.search(c.needle, text) if c.kind == "regex" else c.needle in text
        if not found:
            report.drift.append(Drift(c.file, c.needle, c.why, "not found"))
    return report
