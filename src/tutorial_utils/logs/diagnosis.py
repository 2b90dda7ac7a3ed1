"""The diagnosis of a run's logs: which success signs were seen, which stage failed and why.

The detectors hold upstream DiT4DiT's real error strings (docs/FACTS.md section 11), each with its
cause and fix; :func:`diagnose` reads a run directory's logs with the parsers of
:mod:`tutorial_utils.logs.lines` and names the stage that failed. CLI:
``python -m tutorial_utils logs diagnose RUN_DIR`` and ``python -m tutorial_utils logs parse KIND LOG``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tutorial_utils.logs.lines import (
    EVAL_EGL_HARMLESS,
    log_text,
    parse_eval_log,
    parse_server_log,
    parse_train_log,
    traceback_errors,
)

__all__ = [
    "UPSTREAM_TRAIN_STAGES",
    "SMOKE_TEST_STEPS",
    "SMOKE_SIGN",
    "UPSTREAM_TRAIN_SIGNS",
    "UPSTREAM_TRAIN_CAUSES",
    "Detector",
    "DETECTORS",
    "detect",
    "Diagnosis",
    "EVAL_SIGNS",
    "TRAIN_SIGNS",
    "train_signs",
    "EVAL_STAGES",
    "diagnose",
]

# --- detectors: upstream's real error strings (FACTS section 11) -----------------------------------

#: Upstream ``train.py main()``'s stages in order, each with the lines that show it has started.
#: A stage whose start is seen while the next one's is not is the stage that failed.
UPSTREAM_TRAIN_STAGES: tuple[tuple[str, str | None], ...] = (
    ("config", None),
    ("framework build", r"VLA Training :: Warming Up|Configuration wrapped for access tracking"),
    ("data loader", r"Creating VLA Dataset with Mixture"),
    ("optimiser", r"dataset statistics saved to|Saved dataset statistics file"),
    ("pretrained load", r"LR Group \S+: lr=|loading checkpoint: "),
    (
        "freeze",
        r"loaded <full_model> model parameters|parameters loaded to module|Loaded pretrained checkpoint:"
        r"|No pretrained checkpoint provided|Resuming training from checkpoint",
    ),
    ("parameter totals", r"Model Parameter Statistics \(after freezing\)"),
    ("DeepSpeed prepare", r"Trainable ratio:|# Parameters \(in millions\)"),
    ("wandb init", r"^wandb: "),
    ("optimisation steps", r"\*\*\*\*\* Training Configuration \*\*\*\*\*|Total optimization steps ="),
    ("loss lines", r"len\(vla_train_dataloader\) ="),
    ("final save", None),  # started once the last step's loss line is logged
)
#: The success sign each upstream stage leaves when it is done (keys of ``Diagnosis.signs``).
#: A run of at most this many steps is the smoke test: each of its steps must log a loss line.
SMOKE_TEST_STEPS = 2
SMOKE_SIGN = "a loss line for every step"
UPSTREAM_TRAIN_SIGNS = (
    "config loaded",
    "framework built",
    "data loader built",
    "optimiser built",
    "pretrained weights loaded",
    "modules frozen",
    "parameters counted",
    "DeepSpeed prepared",
    "wandb started",
    "optimisation steps logged",
    "first loss line",
    "training complete",
)
#: Lines only upstream's train.py prints (the mini backend shares the parameter, step and loss lines).
_UPSTREAM_TRAIN_MARKER = re.compile(
    r"VLA Training :: Warming Up|Configuration wrapped for access tracking|Creating VLA Dataset with Mixture"
    r"|dataset statistics saved to|LR Group \S+: lr=|Model Parameter Statistics \(after freezing\)"
    r"|# Parameters \(in millions\)|\*\*\*\*\* Training Configuration \*\*\*\*\*|^wandb: "
    r"|^Distributed environment: |DiT4DiT/training/train\.py",
    re.M,
)

#: The launcher's own report that its child failed: never the cause.
_LAUNCHER_ERROR = re.compile(r"ChildFailedError|CalledProcessError")

#: Likely causes of each upstream training stage when no detector names the error.
UPSTREAM_TRAIN_CAUSES: dict[str, tuple[str, ...]] = {
    "config": (
        "the process died before main(): run from the checkout root with PYTHONPATH=$PWD (train.py reads "
        "DiT4DiT/config/deepseeds/ds_config.yaml relative to it) and launch it with `accelerate launch`",
        "pass --config_yaml DiT4DiT/config/libero/dit4dit_libero.yaml (the default is the placeholder xxx.yaml)",
    ),
    "framework build": (
        "the Cosmos backbone did not load: --framework.cosmos25.base_model must name the local folder "
        "downloaded with --revision diffusers/base/post-trained (it holds model_index.json)",
        "a framework import error shows only as 'Failed to auto-import framework submodules: <error>'",
        "out of GPU memory while building the model",
    ),
    "data loader": (
        "the mixture name is not in DATASET_NAMED_MIXTURES (only libero_all upstream): register a one-dataset mixture",
        "--datasets.vla_data.data_root_dir must hold <dataset>/meta/modality.json, and meta/ must be writable",
    ),
    "optimiser": ("building the parameter groups failed: read the traceback above",),
    "pretrained load": (
        "--trainer.pretrained_checkpoint must be the released dit4dit_libero/final_model/pytorch_model.pt; "
        "loading the full state dict needs tens of GB of CPU memory",
    ),
    "freeze": ("--trainer.freeze_modules names a module path that does not exist (look for '⚠️ module path')",),
    "parameter totals": ("the process died right after freezing (out of CPU memory?): read the end of the log",),
    "DeepSpeed prepare": (
        "accelerate.prepare/DeepSpeed failed: nothing trainable (freezing everything), out of GPU memory, "
        "or a deepspeed install that does not match (upstream pins 0.18.4)",
    ),
    "wandb init": ("wandb.init needs an account: export WANDB_MODE=offline",),
    "optimisation steps": ("the run died while logging its configuration: read the traceback",),
    "loss lines": (
        "the loss is logged every trainer.logging_frequency steps (default 10): a 2-step run needs "
        "--trainer.logging_frequency 1",
        "the run was killed or crashed mid-training (out of GPU memory, a data read error)",
    ),
    "final save": (
        "saving final_model/pytorch_model.pt (the full state dict, tens of GB) failed: disk full on "
        "--run_root_dir, or the process was killed while writing; it may also still be running",
    ),
}


@dataclass(frozen=True)
class Detector:
    """One upstream error string: where it shows, what it means and the fix.

    ``pattern`` is searched (multi-line) in a normalised log; ``requires``, when set, must also be
    found in the same log (``{group}`` in it stands for what the pattern's named group matched). ``stages`` maps a log kind (``train``, ``server``, ``eval``,
    ``download``) to the stage it names; a kind it does not list takes the stage from the log's
    own order. ``message`` is the text the troubleshooting page shows; ``facts`` where docs/FACTS.md
    says so.
    """

    name: str
    pattern: str
    stages: tuple[tuple[str, str], ...]
    cause: str
    fix: str
    message: str
    facts: str = "FACTS 11"
    requires: str | None = None

    def stage_for(self, kind: str) -> str | None:
        return dict(self.stages).get(kind)

    def search(self, text: str) -> re.Match[str] | None:
        for m in re.finditer(self.pattern, text, re.M):
            if not self.requires:
                return m
            need = self.requires
            for key, val in m.groupdict().items():
                need = need.replace("{" + key + "}", re.escape(val or ""))
            if re.search(need, text, re.M):
                return m
        return None


_STARTUP = (("train", "config"), ("server", "server"), ("eval", "client connect"))
_BUILD = (("train", "framework build"), ("server", "server"), ("eval", "client connect"))
_CLIENT = (("eval", "client connect"),)
_HUB = (("download", "download"),)

#: One entry per upstream error string of FACTS section 11 (and the Hub's, both wordings).
DETECTORS: tuple[Detector, ...] = (
    Detector(
        "no_dit4dit_module",
        r"No module named '?DiT4DiT",
        _STARTUP,
        "Python cannot import the upstream package: PYTHONPATH does not hold the checkout root",
        "run from the checkout root (it holds DiT4DiT/, deployment/, examples/) with `export PYTHONPATH=$PWD`",
        "ModuleNotFoundError: No module named 'DiT4DiT'",
    ),
    Detector(
        "not_checkout_root",
        r"(?:No such file or directory|existing deepspeed config).*ds_config\.yaml",
        _STARTUP,
        "train.py reads DiT4DiT/config/deepseeds/ds_config.yaml relative to the working directory",
        "cd to the checkout root before `accelerate launch DiT4DiT/training/train.py ...`",
        "ValueError: Expected a string path to an existing deepspeed config, ... Received: "
        "DiT4DiT/config/deepseeds/ds_config.yaml",
        facts="FACTS 1",
    ),
    Detector(
        "config_yaml_placeholder",
        r"No such file or directory: '?xxx\.yaml",
        _STARTUP,
        "train.py was started without --config_yaml, whose default is the placeholder xxx.yaml",
        "pass --config_yaml DiT4DiT/config/libero/dit4dit_libero.yaml",
        "FileNotFoundError: [Errno 2] No such file or directory: 'xxx.yaml'",
        facts="FACTS 1",
    ),
    Detector(
        "mixture_unknown",
        r"KeyError: '(?P<mixture>[^']+)'",
        (("train", "data loader"),),
        "the data mixture is not in DATASET_NAMED_MIXTURES (upstream defines only libero_all)",
        "register a one-dataset mixture such as ('libero_spatial_no_noops_1.0.0_lerobot', 1.0, 'libero_franka') "
        "with the bridge's mixture launcher and pass its name to --datasets.vla_data.data_mix",
        "KeyError: 'libero_spatial_only'",
        requires=r"DATASET_NAMED_MIXTURES\[|Mixture `{mixture}`",
    ),
    Detector(
        "dataset_root_placeholder",
        r"/path/to/dataset/libero",
        (("train", "data loader"),),
        "data_root_dir is still the YAML placeholder /path/to/dataset/libero",
        "pass --datasets.vla_data.data_root_dir $DATA/datasets (the folder that holds the downloaded dataset)",
        "FileNotFoundError: Dataset path /path/to/dataset/libero/<dataset> does not exist",
    ),
    Detector(
        "dataset_path_missing",
        r"Dataset path (?P<path>\S+) does not exist",
        (("train", "data loader"),),
        "<data_root_dir>/<dataset> does not exist",
        "download the dataset into $DATA/datasets/<dataset> (`python -m tutorial_utils hub download "
        "dataset:<suite>`) and pass that parent folder as --datasets.vla_data.data_root_dir",
        "FileNotFoundError: Dataset path <data_root_dir>/<dataset> does not exist",
    ),
    Detector(
        "modality_json_missing",
        r"Please provide a meta/modality\.json file in",
        (("train", "data loader"),),
        "the dataset has no meta/modality.json (the IPEC datasets do not ship it)",
        "copy upstream's examples/LIBERO/train_files/modality.json into <data_root_dir>/<dataset>/meta/ "
        "(the bridge writes it); meta/ must be writable",
        "AssertionError: Please provide a meta/modality.json file in <path>",
    ),
    Detector(
        "cosmos_placeholder",
        r"/path/to/Cosmos-Predict2\.5-2B",
        _BUILD,
        "framework.cosmos25.base_model is still the YAML placeholder /path/to/Cosmos-Predict2.5-2B",
        "training: pass --framework.cosmos25.base_model $MODELS/Cosmos-Predict2.5-2B; serving: set "
        "framework.cosmos25.base_model in the checkpoint's config.yaml (the bridge fixes it, with a backup)",
        "HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
        "'/path/to/Cosmos-Predict2.5-2B'",
    ),
    Detector(
        "cosmos_no_model_index",
        r"no file named model_index\.json|model_index\.json.*(?:not found|No such file)",
        _BUILD,
        "the Cosmos folder has no model_index.json: it was downloaded without the diffusers revision",
        "hf download nvidia/Cosmos-Predict2.5-2B --revision diffusers/base/post-trained --local-dir "
        "$MODELS/Cosmos-Predict2.5-2B (or `python -m tutorial_utils hub download cosmos`)",
        "OSError: Error no file named model_index.json found in directory $MODELS/Cosmos-Predict2.5-2B.",
    ),
    Detector(
        "framework_import_hidden",
        r"Failed to auto-import framework submodules: (?P<error>.*)|Framework \S+ is not implemented",
        _BUILD,
        "importing the framework module failed and upstream only logged a warning, so DiT4DiT was never registered",
        "read the error after 'Failed to auto-import framework submodules:' (often a missing package); "
        "see the full traceback with `python -c 'import DiT4DiT.model.framework.DiT4DiT'` from the checkout root",
        "Failed to auto-import framework submodules: <error> ... NotImplementedError: Framework DiT4DiT is not "
        "implemented",
    ),
    Detector(
        "no_process_group",
        r"Default process group has not been initialized",
        (),
        "train.py was run with plain `python`: torch.distributed has no process group",
        "launch with `accelerate launch --config_file DiT4DiT/config/deepseeds/deepspeed_zero2.yaml "
        "--num_processes 1 DiT4DiT/training/train.py ...`",
        "ValueError: Default process group has not been initialized, please make sure to call init_process_group.",
    ),
    Detector(
        "pretrained_checkpoint_missing",
        r"Pretrained checkpoint `?\S+?`? does not exist|loading checkpoint failed",
        (("train", "pretrained load"), ("server", "server"), ("eval", "client connect")),
        "the checkpoint path does not name an existing .pt file",
        "point --trainer.pretrained_checkpoint / --ckpt_path / --args.pretrained-path at "
        "$MODELS/dit4dit-model/dit4dit_libero/final_model/pytorch_model.pt (download with --include 'dit4dit_libero/*')",
        "FileNotFoundError: Pretrained checkpoint `<path>` does not exist.",
    ),
    Detector(
        "config_yaml_missing",
        r"Missing `?config\.yaml`? for",
        (("server", "server"), ("eval", "client connect")),
        "the server and the client read config.yaml at <pt>.parents[1]; a smoke run's final_model has none",
        "put a config.yaml in that run directory: the merged training config, or the released one with "
        "framework.cosmos25.base_model fixed (the bridge's final_model fix-up)",
        "AssertionError: Missing `config.yaml` for `run_dir = ...`",
    ),
    Detector(
        "dataset_statistics_missing",
        r"Missing `?dataset_statistics\.json`? for",
        (("server", "server"), ("eval", "client connect")),
        "dataset_statistics.json is missing at <pt>.parents[1]",
        "copy dataset_statistics.json from the training run directory (written when its data loader was built)",
        "AssertionError: Missing `dataset_statistics.json` for `run_dir = ...`",
    ),
    Detector(
        "wandb_no_account",
        r"api_key not configured|wandb\.login\(",
        (("train", "wandb init"),),
        "wandb.init is always called and there is no W&B account here",
        "export WANDB_MODE=offline (curves are written under the run directory)",
        "wandb.errors.UsageError: api_key not configured (no-tty). call wandb.login(key=[your_api_key])",
        facts="FACTS 1",
    ),
    Detector(
        "server_idle_timeout",
        r"Idle timeout \((?P<seconds>-?\d+)s\) reached, shutting down server",
        (),
        "the server stopped itself after --idle_timeout seconds without a request",
        "start the client within --idle_timeout seconds of the server (default 1800), or pass a larger "
        "--idle_timeout (-1: never)",
        "INFO:root:Idle timeout (1800s) reached, shutting down server.",
    ),
    Detector(
        "client_connect_timeout",
        r"Failed to connect to server within (?P<seconds>\d+) seconds",
        _CLIENT,
        "the client found no server at --args.host/--args.port within 300 s",
        "start the server first and wait for 'server listening on'; use the same port on both sides "
        "(--port and --args.port); if the server log stops early, the server crashed while loading",
        "TimeoutError: Failed to connect to server within 300 seconds",
    ),
    Detector(
        "inference_server_error",
        r"Error in inference server",
        (("eval", "evaluation"),),
        "the server answered a request with a traceback instead of actions",
        "read the server traceback printed after the message and server.log; a wrong observation shape "
        "(use the dit4dit client profile) or CUDA out of memory are the usual causes",
        "RuntimeError: Error in inference server: ...",
    ),
    Detector(
        "py38_union_annotation",
        r"unsupported operand type\(s\) for \|",
        _CLIENT,
        "the LIBERO Python (3.8) cannot evaluate `np.ndarray | float` annotations in eval_libero.py",
        "add `from __future__ import annotations` at the top of eval_libero.py (the bridge prints the patch), "
        "or use a LIBERO environment with Python >= 3.10",
        "TypeError: unsupported operand type(s) for |: 'type' and 'type'",
    ),
    Detector(
        "py38_subscript_annotation",
        r"'type' object is not subscriptable",
        _CLIENT,
        "the LIBERO Python (3.8) cannot evaluate `list[int]` / `tuple[dict[...]]` in model2libero_interface.py",
        "add `from __future__ import annotations` at the top of model2libero_interface.py (the bridge prints the "
        "patch), or use a LIBERO environment with Python >= 3.10",
        "TypeError: 'type' object is not subscriptable",
    ),
    Detector(
        "websockets_ping_interval",
        r"create_connection\(\) got an unexpected keyword argument '(?:ping_interval|ping_timeout)'",
        _CLIENT,
        "websockets 13.1 (the newest for Python 3.8) forwards unknown keyword arguments to the socket",
        "drop ping_interval and ping_timeout from the connect call in websocket_policy_client.py (the bridge "
        "prints the patch); upgrading websockets is impossible on Python 3.8",
        "TypeError: create_connection() got an unexpected keyword argument 'ping_interval'",
    ),
    Detector(
        "hub_gated",
        r"Cannot access gated repo|GatedRepoError|Access denied\. \w+ '[^']+' requires approval"
        r"|not in the authorized list|403 Forbidden|403 Client Error",
        _HUB,
        "the repo is gated (Cosmos) and this account has not accepted its licence, or the token has no read "
        "access to it (HTTP 403)",
        "open the model page, log in with the account of your token, accept the licence, wait for the "
        "approval, then rerun the download",
        "403 Client Error ... Cannot access gated repo (0.x: ... not in the authorized list; 1.x CLI: "
        "Access denied. Model '<repo>' requires approval.)",
    ),
    Detector(
        "hub_unauthorized",
        r"401 Client Error|Invalid credentials in Authorization header|Invalid user token"
        r"|Not logged in\. Run 'hf auth login'|LocalTokenNotFoundError",
        _HUB,
        "no token, or a wrong or revoked one, was sent (HTTP 401)",
        "export HF_TOKEN=hf_... (or `hf auth login`) in the shell that runs the download, then rerun; "
        "never paste the token into a notebook",
        "401 Client Error ... Invalid credentials in Authorization header",
    ),
    Detector(
        "hub_repo_not_found",
        r"RepositoryNotFoundError|Repository Not Found for url|(?:Model|Dataset|Space|Repository) '[^']+' not found\.",
        _HUB,
        "the repo id or its type is wrong (a private or gated repo also looks missing without a token)",
        "check the repo id and --repo-type (datasets need --repo-type dataset); then check the token",
        "RepositoryNotFoundError: 404 Client Error ... Repository Not Found for url (1.x CLI: Model '<repo>' not "
        "found.)",
    ),
    Detector(
        "hub_revision_not_found",
        r"RevisionNotFoundError|Revision Not Found for url|Revision not found in|Invalid rev id",
        _HUB,
        "the revision (branch, tag or commit) does not exist in that repo",
        "check the revision on the repo page; Cosmos needs --revision diffusers/base/post-trained",
        "RevisionNotFoundError: 404 Client Error ... Revision Not Found for url (1.x CLI: Revision not found in "
        "model '<repo>'.)",
    ),
    Detector(
        "hub_timeout",
        r"ReadTimeout|ConnectTimeout|Read timed out|The read operation timed out|TimeoutException"
        r"|the download timed out or stalled",
        _HUB,
        "the Hub did not answer in time, or the transfer stalled",
        "rerun (finished files are kept); export HF_HUB_DOWNLOAD_TIMEOUT=600; behind a proxy export "
        "HF_HUB_DISABLE_XET=1",
        "httpx.ReadTimeout: The read operation timed out (0.x: requests.exceptions.ReadTimeout: ... Read timed out.)",
    ),
    Detector(
        "disk_full",
        r"No space left on device|\[Errno 28\]|PytorchStreamWriter failed writing file",
        _HUB,
        "the disk under the destination is full",
        "free space or move the role to a bigger mount (chapter 1's disk plan: HF_HOME for models, "
        "TUTORIAL_DATA_DIR for datasets, TUTORIAL_RUNS_DIR for runs; a final_model is tens of GB)",
        "OSError: [Errno 28] No space left on device",
    ),
    Detector(
        "cuda_out_of_memory",
        r"CUDA out of memory|OutOfMemoryError",
        (),
        "the GPU ran out of memory",
        "training: --datasets.vla_data.per_device_batch_size 1 and freeze backbone_interface; serving: "
        "--use_bf16; check that no other process holds the GPU (nvidia-smi)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ...",
        facts="FACTS 1",
    ),
)


def detect(text: str, kind: str) -> list[dict[str, Any]]:
    """The detectors whose error string occurs in a (normalised) log of ``kind``, in table order."""
    from tutorial_utils import secrets

    found = []
    for det in DETECTORS:
        m = det.search(text)
        if m is None:
            continue
        line_start = text.rfind("\n", 0, m.start()) + 1
        line_end = text.find("\n", m.end())
        evidence = text[line_start : line_end if line_end >= 0 else len(text)].strip()
        found.append(
            {
                "name": det.name,
                "log": kind,
                "stage": det.stage_for(kind),
                "cause": det.cause,
                "fix": det.fix,
                "facts": det.facts,
                "evidence": secrets.redact(evidence[:240]),
            }
        )
    return found


# --- diagnosis -----------------------------------------------------------------------------------


@dataclass
class Diagnosis:
    """What a run's logs show: the success signs seen, the stage that failed, likely causes."""

    run_dir: str
    kind: str  # "evaluation", "training", "download" or "unknown"
    signs: dict[str, bool] = field(default_factory=dict)
    failed_stage: str | None = None
    causes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    #: the upstream error strings found (``detect``): name, log, stage, cause, fix, facts, evidence
    detectors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed_stage is None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def __str__(self) -> str:
        out = [f"run: {self.run_dir} ({self.kind})"]
        out += [f"  [{'x' if seen else ' '}] {name}" for name, seen in self.signs.items()]
        for k, v in self.figures.items():
            out.append(f"  {k}: {v}")
        if self.ok:
            out.append("verdict: OK, every success sign was seen")
        else:
            out.append(f"verdict: FAILED at stage '{self.failed_stage}'. Likely causes:")
            out += [f"  - {c}" for c in self.causes]
        if self.detectors and not self.ok:
            out.append("detectors matched (name: fix):")
            out += [f"  - {f['name']}: {f['fix']}" for f in self.detectors]
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


#: Success signs of an evaluation run, in the order they appear.
EVAL_SIGNS = (
    "server running",
    "server listening",
    "connection open",
    "task started",
    "episode finished",
    "total success rate",
)
#: Success signs of a training run.
TRAIN_SIGNS = ("parameters counted", "first loss line", "training complete")


def train_signs(parsed: dict[str, Any]) -> dict[str, bool]:
    """The :data:`TRAIN_SIGNS` of a training log parsed by :func:`parse_train_log` (ours or
    upstream's: they share the parameter, loss and final-model lines)."""
    return dict(
        zip(TRAIN_SIGNS, (parsed["total_params"] is not None, bool(parsed["steps"]), parsed["final_model"] is not None))
    )


def _first(run: Path, patterns: tuple[str, ...], exclude: str = "") -> Path | None:
    for pat in patterns:
        hits = sorted(p for p in run.glob(pat) if not (exclude and exclude in p.name))
        if hits:
            return hits[0]
    return None


#: The stages of an evaluation run, in order.
EVAL_STAGES = ("server", "client connect", "LIBERO setup", "evaluation")


def _apply_detectors(d: Diagnosis, found: list[dict[str, Any]], order: tuple[str, ...]) -> None:
    """Add matched detectors to ``d``: on a failed run the first one whose stage is not earlier
    than the stage the logs reached names the stage, and each one's cause leads the causes."""
    if not found:
        return
    d.detectors = found
    if d.ok:
        d.notes += [f"{f['name']} matched although every success sign was seen: {f['evidence']}" for f in found]
        return
    reached = order.index(d.failed_stage) if d.failed_stage in order else 0
    for f in found:
        if f["stage"] in order and order.index(f["stage"]) >= reached:
            d.failed_stage = f["stage"]
            break
    d.causes = [f"{f['cause']} [{f['name']}] ({f['log']} log: {f['evidence']})" for f in found] + d.causes


def _diagnose_eval(d: Diagnosis, server_log: Path | None, eval_log: Path | None) -> None:
    srv = parse_server_log(server_log) if server_log else None
    ev = parse_eval_log(eval_log) if eval_log else None
    _diagnose_eval_stages(d, srv, ev)
    found = (detect(log_text(server_log), "server") if server_log else []) + (
        detect(log_text(eval_log), "eval") if eval_log else []
    )
    _apply_detectors(d, found, EVAL_STAGES)


def _diagnose_eval_stages(d: Diagnosis, srv: dict[str, Any] | None, ev: dict[str, Any] | None) -> None:
    d.signs = {
        "server running": bool(srv and srv["running"]),
        "server listening": bool(srv and srv["listening"]),
        "connection open": bool(srv and srv["connections_open"]),
        "task started": bool(ev and ev["tasks"]),
        "episode finished": bool(ev and ev["episodes"]),
        "total success rate": bool(ev and ev["total_rate"] is not None),
    }
    if ev:
        d.figures = {"episodes": ev["episodes"], "successes": ev["successes"], "total_success_rate": ev["total_rate"]}
    if srv and srv["request_errors"]:
        d.figures["server_request_errors"] = len(srv["request_errors"])
    ev_errors = ev["errors"] if ev else []
    srv_errors = srv["errors"] if srv else []
    if ev and ev["egl_after_total"]:
        d.notes.append(
            f"{EVAL_EGL_HARMLESS} after 'Total success rate' is robosuite's renderer cleanup at exit: harmless."
        )

    if srv is None:
        d.failed_stage = "server"
        d.causes = [
            "no server.log in the run directory: the server was never started, or the job died before collecting logs"
        ]
        return
    if not (d.signs["server running"] or d.signs["server listening"]) or (
        srv["port_in_use"] and not d.signs["server listening"]
    ):
        d.failed_stage = "server"
        if srv["port_in_use"]:
            d.causes.append("the port is already in use by another process: pick another `port` (0 picks a free one)")
        d.causes += [f"the policy cannot be served here: {r}" for r in srv["policy_unavailable"]]
        d.causes += [f"the server crashed at startup: {e}" for e in srv_errors[-2:]]
        d.causes.append("the server's packages or checkpoint failed to load: read server.log from the top")
        return
    if not d.signs["connection open"]:
        d.failed_stage = "client connect"
        d.causes = [
            "the LIBERO client was not started, or it crashed before connecting (missing packages: read the eval log)",
            "the client connected to a different host/port than the server's 'server listening on' line",
        ] + [f"client error: {e}" for e in ev_errors[-2:]]
        return
    if not d.signs["task started"]:
        d.failed_stage = "LIBERO setup"
        d.causes = [
            "LIBERO could not load its suite or assets: check LIBERO_CONFIG_PATH and the paths in its config.yaml",
            "no offscreen GL backend: MUJOCO_GL=egl needs libegl1 libegl-mesa0 libgl1-mesa-dri, osmesa needs libosmesa6",
        ] + [f"client error: {e}" for e in ev_errors[-2:]]
        if ev and ev["egl_before_total"]:
            d.causes.insert(
                0, f"{EVAL_EGL_HARMLESS} before any task: the EGL backend does not work here; try MUJOCO_GL=osmesa"
            )
        return
    if not d.signs["total success rate"]:
        d.failed_stage = "evaluation"
        d.causes = [f"client error: {e}" for e in ev_errors[-2:]]
        if srv_errors:
            d.causes.append(f"the policy server raised: {srv_errors[-1]}")
        d.causes += [
            "the server died or stopped answering mid-episode (the client then raises ServerDied): read server.log",
            "the client was killed (out of memory: ~2 GB per rendering env) or interrupted before the last episode",
        ]
        return


def _diagnose_train(d: Diagnosis, train_log: Path) -> None:
    text = log_text(train_log)
    tr = parse_train_log(text)
    found = detect(text, "train")
    d.figures = {
        "steps_logged": len(tr["steps"]),
        "last_step": tr["steps"][-1]["step"] if tr["steps"] else None,
        "last_total_loss": (tr["steps"][-1]["losses"].get("total_loss") if tr["steps"] else None),
        "final_model": tr["final_model"],
    }
    errs = [f"error in the log: {e}" for e in [e for e in tr["errors"] if not _LAUNCHER_ERROR.search(e)][-2:]]
    if _UPSTREAM_TRAIN_MARKER.search(text) or any(f["stage"] for f in found):
        _diagnose_upstream_train(d, text, tr, errs)
        _smoke_check(d, tr)
        _apply_detectors(d, found, tuple(s for s, _ in UPSTREAM_TRAIN_STAGES))
        return
    d.signs = train_signs(tr)
    for sign, stage, causes in _TRAIN_STAGES:
        if not d.signs[sign]:
            d.failed_stage, d.causes = stage, errs + list(causes)
            break
    _smoke_check(d, tr)
    _apply_detectors(d, found, tuple(stage for _, stage, _ in _TRAIN_STAGES))


def _smoke_check(d: Diagnosis, tr: dict[str, Any]) -> None:
    """A run of at most :data:`SMOKE_TEST_STEPS` steps is the smoke test: each step must show its loss."""
    total = tr["total_steps"]
    if total is not None and 0 < total <= SMOKE_TEST_STEPS:  # the smoke test: every step shows its loss
        logged = sorted({int(s["step"]) for s in tr["steps"]})
        d.signs[SMOKE_SIGN] = logged == list(range(1, int(total) + 1))
        if not d.signs[SMOKE_SIGN] and d.failed_stage is None:
            d.failed_stage = "training"
            d.causes = [
                f"the {int(total)}-step smoke test logged the loss of step(s) {logged or 'none'}, not of each of "
                f"steps 1..{int(total)}: pass --trainer.logging_frequency 1 (upstream's default is 10)"
            ]


def _diagnose_upstream_train(d: Diagnosis, text: str, tr: dict[str, Any], errs: list[str]) -> None:
    """Upstream ``train.py``'s stage order (FACTS section 11): the last stage that started failed."""
    last = 0
    for i, (_, pat) in enumerate(UPSTREAM_TRAIN_STAGES):
        if pat and re.search(pat, text, re.M):
            last = i
    if tr["steps"] and tr["total_steps"] and tr["steps"][-1]["step"] >= tr["total_steps"]:
        last = len(UPSTREAM_TRAIN_STAGES) - 1
    complete = tr["final_model"] is not None
    if complete:
        last = len(UPSTREAM_TRAIN_STAGES)
    d.signs = {name: i < last for i, name in enumerate(UPSTREAM_TRAIN_SIGNS)}
    ours = train_signs(tr)
    ours["parameters counted"] = ours["parameters counted"] or d.signs["parameters counted"]
    d.signs.update(ours)
    d.figures.update({"run_id": tr["run_id"], "total_steps": tr["total_steps"], "backend": "dit4dit"})
    for i, name in enumerate(UPSTREAM_TRAIN_SIGNS):
        if not d.signs[name]:
            stage = UPSTREAM_TRAIN_STAGES[i][0]
            d.failed_stage, d.causes = stage, errs + list(UPSTREAM_TRAIN_CAUSES[stage])
            break


def _diagnose_download(d: Diagnosis, log: Path) -> None:
    text = log_text(log)
    d.signs = {"download verified": bool(re.search(r"verified: |manifest\.json", text))}
    if not d.signs["download verified"]:
        d.failed_stage = "download"
        d.causes = [f"error in the log: {e}" for e in traceback_errors(text.splitlines())[-2:]] + [
            "the download stopped before verification: rerun `python -m tutorial_utils hub download ASSET`"
        ]
    _apply_detectors(d, detect(text, "download"), ("download",))


#: (missing sign, stage that failed, likely causes) of a training run, in order.
_TRAIN_STAGES = (
    (
        "parameters counted",
        "model setup",
        (
            "the config did not load: pass --config_yaml (the default is the placeholder xxx.yaml) and run from the repo root",
            "wandb.init needs an account: set WANDB_MODE=offline",
            "the backbone weights were not downloaded (gated model: accept the licence and set HF_TOKEN)",
        ),
    ),
    (
        "first loss line",
        "data loading",
        (
            "the data mixture is unknown (libero_spatial_only does not exist upstream: register a mixture entry)",
            "the dataset path or meta files (modality.json, stats) are missing or invalid",
            "the loss is printed every trainer.logging_frequency steps: a 2-step run needs --trainer.logging_frequency 1",
        ),
    ),
    (
        "training complete",
        "training",
        (
            "the run was killed or crashed mid-training (out of memory, disk full while saving a checkpoint)",
            "it is still running: check the process and the newest checkpoint",
        ),
    ),
)


def _short(path: str | os.PathLike) -> str:
    """``path`` relative to the repository when it lies inside it (what the book shows)."""
    from tutorial_utils import paths

    p = Path(path).resolve()
    try:
        return p.relative_to(paths.REPO).as_posix()
    except ValueError:
        return str(path)


def diagnose(
    run_dir: str | os.PathLike | None = None,
    *,
    server_log: str | os.PathLike | None = None,
    eval_log: str | os.PathLike | None = None,
    train_log: str | os.PathLike | None = None,
    download_log: str | os.PathLike | None = None,
) -> Diagnosis:
    """Read a run's logs and say which success signs were seen and, when one is missing, which
    stage failed and the likely causes.

    An evaluation run directory has ``server.log`` and ``eval_<suite>.log``; a training run
    ``train.log``. Promoted logs (``logs/eval_server.log`` ...) are diagnosed by naming the
    files: ``diagnose(server_log=..., eval_log=...)``. A download run has ``download*.log``.

    Upstream DiT4DiT's own logs (Rich-formatted or plain) are read too: training follows
    upstream's stage order, and each known upstream error string adds a detector with its fix
    (``Diagnosis.detectors``, table ``DETECTORS``).
    """
    run = Path(run_dir) if run_dir is not None else None
    if run is not None:
        if not run.is_dir():
            raise FileNotFoundError(
                f"run directory {run} does not exist; list runs with `python -m tutorial_utils job list`"
            )
        server_log = server_log or _first(run, ("server.log", "*server*.log"))
        eval_log = eval_log or _first(run, ("eval_*.log", "eval.log"), exclude="server")
        train_log = train_log or _first(run, ("train.log", "train_*.log"))
        download_log = download_log or _first(run, ("download*.log", "hub*.log"))
    logs = (server_log, eval_log, train_log, download_log)
    where = _short(run) if run is not None else ", ".join(_short(p) for p in logs if p)
    for p in logs:
        if p is not None and not Path(p).is_file():
            raise FileNotFoundError(f"log file {p} not found")
    server_log, eval_log, train_log, download_log = (Path(p) if p else None for p in logs)
    if server_log or eval_log:
        d = Diagnosis(where, "evaluation")
        _diagnose_eval(d, server_log, eval_log)
    elif train_log:
        d = Diagnosis(where, "training")
        _diagnose_train(d, train_log)
    elif download_log:
        d = Diagnosis(where, "download")
        _diagnose_download(d, download_log)
    else:
        d = Diagnosis(
            where,
            "unknown",
            failed_stage="no logs",
            causes=[
                f"no server.log, eval_*.log or train.log in {where}: the job failed before its first stage "
                "(read status.json and the executed notebook)"
            ],
        )
    if run is None:
        return d
    status = run / "status.json"
    if status.is_file():
        try:
            st = json.loads(status.read_text())
        except ValueError:
            st = {}
        if st.get("state") == "failed" and d.ok:
            d.notes.append(f"status.json says the job failed: {st.get('error')}")
    return d


# --- CLI -----------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m tutorial_utils logs", description="Parse run logs and diagnose which stage failed."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    dg = sub.add_parser("diagnose", help="success signs, failed stage and likely causes of a run directory")
    dg.add_argument("run_dir")
    dg.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    ps = sub.add_parser("parse", help="parse one log file and print JSON")
    ps.add_argument("kind", choices=("eval", "server", "train"))
    ps.add_argument("path")
    args = ap.parse_args(argv)
    if args.cmd == "parse":
        if not Path(args.path).is_file():
            print(f"error: log file {args.path} not found", file=sys.stderr)
            return 2
        fn = {"eval": parse_eval_log, "server": parse_server_log, "train": parse_train_log}[args.kind]
        print(json.dumps(fn(Path(args.path)), indent=2))
        return 0
    try:
        d = diagnose(args.run_dir)
    except FileNotFoundError as exc:
        from tutorial_utils.errors import error_text

        print(error_text(exc), file=sys.stderr)
        return 2
    print(json.dumps(d.to_dict(), indent=2) if args.json else str(d))
    return 0 if d.ok else 1
