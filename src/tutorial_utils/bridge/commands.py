"""The corrected upstream commands (docs/FACTS.md section 11) as data: argv, environment, directory, log.

:class:`BridgeConfig` holds the paths and sizes; :func:`train_command` (the 2-step smoke test or
a longer run), :func:`serve_command` (upstream's ``server_policy.py``), :func:`eval_command`
(upstream's ``eval_libero.py``) and :func:`client_command` (this project's Python 3.11 LIBERO
client with ``--protocol dit4dit``, pointed at the upstream server) each return a
:class:`Command`. :func:`dry_run` writes them, shell-quoted, into ``commands.sh``: the GPU page
embeds that file, and :func:`parse_commands_sh` reads it back so a test can check that the page
and the code say the same thing.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tutorial_utils.bridge.checkout import DEEPSPEED_YAML, EVAL_PY, LIBERO_YAML, SERVER_PY, TRAIN_PY
from tutorial_utils.errors import ConfigError
from tutorial_utils.params import param
from tutorial_utils.sim.libero_env import SUITES

COMMANDS_SH = "commands.sh"
TRAIN_LOG = "train.log"
SERVER_LOG = "server.log"
COSMOS_DIRNAME = "Cosmos-Predict2.5-2B"
CHECKPOINT_DIRNAME = "dit4dit-model"
#: The released LIBERO checkpoint inside ``models_dir`` (``hf download ... --include "dit4dit_libero/*"``).
RELEASED_CHECKPOINT = f"{CHECKPOINT_DIRNAME}/dit4dit_libero/final_model/pytorch_model.pt"
#: What the official recipe freezes; the smoke test freezes the whole backbone instead.
OFFICIAL_FREEZE = "backbone_interface.extractor.text_encoder,backbone_interface.extractor.vae"
#: Upstream logs through Rich, which wraps at 80 columns when not on a terminal; 200 wraps less
#: (the diagnosis reads both, FACTS section 11).
RICH_WIDTH = {"COLUMNS": "200"}
#: Variables that make Rich (and other tools) write colour codes and links into a log file.
FORCE_TERMINAL_VARS = ("FORCE_COLOR", "CLICOLOR_FORCE", "PY_COLORS", "TTY_COMPATIBLE", "TTY_INTERACTIVE")


def eval_log_name(suite: str) -> str:
    """``eval_<suite>.log``: the same name the mini backend's chain writes."""
    return f"eval_{suite}.log"


@dataclass
class BackendParams:
    """The job notebooks' backend parameters (train.md, evaluate.md): ``mini`` runs everywhere,
    ``dit4dit`` drives an upstream checkout on a GPU server through this bridge."""

    backend: str = param(
        "mini", "mini (this project's policies, any machine) | dit4dit (upstream checkout, GPU)", "backend"
    )
    checkout: str = param("", "dit4dit: the upstream checkout root (holds DiT4DiT/, deployment/, examples/)", "backend")
    models_dir: str = param("", "dit4dit: folder holding dit4dit-model/ and Cosmos-Predict2.5-2B/", "backend")
    data_dir: str = param("", "dit4dit: folder holding the dataset folders (upstream's data_root_dir)", "backend")
    runs_dir: str = param("", "dit4dit: where new run directories go (empty: the project's runs/)", "backend")
    model_python: str = param("", "dit4dit: the Python with upstream's packages (empty: `python` on PATH)", "backend")
    libero_python: str = param("", "dit4dit: the Python with LIBERO for upstream's client (empty: this one)", "backend")


#: The keys a job hands to the bridge besides the ones its own config knows.
BACKEND_KEYS = tuple(f for f in BackendParams.__dataclass_fields__ if f != "backend")
BACKENDS = ("mini", "dit4dit")


def split_backend(params: dict) -> tuple[str, dict]:
    """A job's ``backend`` (default mini) and its bridge parameters, taken out of ``params``
    (the rest stays for the job's own config): the one switch of the train and evaluate jobs."""
    backend = str(params.pop("backend", None) or "mini")
    bridge_params = {k: params.pop(k) for k in BACKEND_KEYS if k in params}
    if backend not in BACKENDS:
        raise ConfigError(f"backend={backend!r}: use {' or '.join(BACKENDS)}")
    return backend, bridge_params


@dataclass
class BridgeConfig:
    """Everything the upstream commands need. Paths are made absolute by :meth:`resolved`."""

    checkout: str = param("", "the upstream checkout root")
    models_dir: str = param("", "folder holding dit4dit-model/ and Cosmos-Predict2.5-2B/")
    data_dir: str = param("", "folder holding the dataset folders (upstream's data_root_dir)")
    runs_dir: str = param("", "upstream's run_root_dir: the run directory is <runs_dir>/<run_id>")
    run_id: str = param("dit4dit_smoke", "upstream's run_id")
    model_python: str = param("python", "the Python with upstream's packages (torch 2.7, accelerate, deepspeed)")
    libero_python: str = param("python", "the Python with LIBERO for upstream's eval_libero.py")
    libero_home: str = param("", "the LIBERO repository root (LIBERO_CONFIG_PATH=<libero_home>/libero)")
    accelerate: str = param("accelerate", "the accelerate executable of the model's environment")
    cuda_visible_devices: str | None = param(None, "CUDA_VISIBLE_DEVICES (None: inherited, else 0)")
    num_processes: int = param(1, "accelerate --num_processes (GPUs)")
    dataset: str = param("libero_spatial_no_noops_1.0.0_lerobot", "dataset folder name under data_dir")
    mixture: str = param("tutorial_libero_spatial", "name of the one-dataset mixture the launcher registers")
    steps: int = param(2, "trainer.max_train_steps (the smoke test uses 2)")
    batch_size: int = param(1, "datasets.vla_data.per_device_batch_size")
    logging_frequency: int = param(1, "trainer.logging_frequency (1 shows every loss line)")
    save_interval: int | None = param(None, "trainer.save_interval (None: upstream's 5000)")
    freeze_modules: str = param("backbone_interface", "trainer.freeze_modules")
    pretrained_checkpoint: str = param("", "trainer.pretrained_checkpoint (empty: the released LIBERO checkpoint)")
    checkpoint: str = param("", "the .pt file to serve (empty: the released LIBERO checkpoint)")
    port: int = param(5694, "policy server port (the official script's 5694)")
    use_bf16: bool = param(False, "serve in bfloat16")
    idle_timeout: int = param(1800, "seconds without requests before the server stops itself")
    suite: str = param("libero_spatial", "LIBERO suite")
    trials: int = param(1, "episodes per task (the benchmark uses 50)")
    task_ids: str = param("all", "our client only: tasks to run (all, 0-4, 0,3)")
    connect_timeout: float = param(300.0, "our client only: seconds to wait for the server (upstream waits 300)")

    def resolved(self) -> BridgeConfig:
        """A copy with absolute paths (children run from the checkout, so nothing may be relative)."""
        import dataclasses

        out = dataclasses.replace(self)
        for name in (
            "checkout",
            "models_dir",
            "data_dir",
            "runs_dir",
            "libero_home",
            "pretrained_checkpoint",
            "checkpoint",
        ):
            value = getattr(out, name)
            if value:
                setattr(out, name, os.fspath(Path(value).expanduser().resolve()))
        for name in ("model_python", "libero_python", "accelerate"):
            value = getattr(out, name)
            if value and (os.sep in value):  # a path, not a name looked up on PATH
                setattr(out, name, os.fspath(Path(value).expanduser().absolute()))
        return out

    def check(self) -> None:
        missing = [n for n in ("checkout", "models_dir", "runs_dir") if not getattr(self, n)]
        if missing:
            raise ConfigError(
                f"the dit4dit backend needs {', '.join(missing)}: pass the upstream checkout root, the folder "
                "holding dit4dit-model/ and Cosmos-Predict2.5-2B/ (`python -m tutorial_utils hub download`), and "
                "where runs go (e.g. -p checkout ~/DiT4DiT -p models_dir ~/models -p data_dir ~/data/datasets)."
            )
        if self.suite not in SUITES:
            raise ConfigError(f"suite={self.suite!r}: use one of {', '.join(SUITES)}")
        for n in ("steps", "batch_size", "logging_frequency", "num_processes", "trials"):
            if getattr(self, n) < 1:
                raise ConfigError(f"{n}={getattr(self, n)}: must be at least 1")

    # --- derived paths ---
    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.run_id

    @property
    def cosmos_dir(self) -> Path:
        return Path(self.models_dir) / COSMOS_DIRNAME

    @property
    def released_checkpoint(self) -> Path:
        return Path(self.models_dir) / RELEASED_CHECKPOINT

    @property
    def serve_checkpoint(self) -> Path:
        return Path(self.checkpoint) if self.checkpoint else self.released_checkpoint

    @property
    def cuda(self) -> str:
        if self.cuda_visible_devices is not None:
            return self.cuda_visible_devices
        return os.environ.get("CUDA_VISIBLE_DEVICES", "0")


@dataclass
class Command:
    """One step: what to run, with which extra environment, from where, logged to which file."""

    step: str
    title: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    log: str = ""

    def child_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The child's whole environment: ``base`` (default: this one without secrets) plus :attr:`env`."""
        from tutorial_utils.secrets import scrubbed_env

        env = dict(scrubbed_env() if base is None else base)
        for k in FORCE_TERMINAL_VARS:  # a notebook kernel's: the logs would fill with colour codes
            env.pop(k, None)
        env.update(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def shell(self, background: bool = False, guard: str = "") -> str:
        """The step as shell lines: a subshell, so its ``cd`` and exports do not leak; ``background``
        ends it with ``&``; ``guard`` is a shell condition the step runs under."""
        lines = [f"# step {self.step}: {self.title}" + (f" (log: {self.log})" if self.log else "")]
        lines.append(f"if {guard}; then (" if guard else "(")
        if self.cwd:
            lines.append(f"  cd {shlex.quote(self.cwd)}")
        if self.env:
            lines.append("  export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items()))
        args = [shlex.quote(a) for a in self.argv]
        body = "  " + args[0]
        for a in args[1:]:
            body += (" \\\n    " if a.startswith("--") or a.endswith(".py") else " ") + a
        if self.log:
            body += f" \\\n    > {shlex.quote(self.log)} 2>&1"
        lines += [body, (") &" if background else ")") + ("; fi" if guard else "")]
        return "\n".join(lines)


# --- the commands ---------------------------------------------------------------------------------


def train_command(cfg: BridgeConfig, smoke: bool = True, launcher: str | os.PathLike | None = None) -> Command:
    """``accelerate launch`` of the mixture launcher (or ``train.py`` when ``launcher`` is ``""``).

    ``smoke``: 2 steps, loss every step, the whole backbone frozen (FACTS section 11). Otherwise
    ``cfg.steps``, ``cfg.logging_frequency``, ``cfg.freeze_modules`` and ``cfg.save_interval``.
    """
    from tutorial_utils.bridge.launcher import LAUNCHER_NAME

    cfg = cfg.resolved()
    script = os.fspath(cfg.run_dir / LAUNCHER_NAME) if launcher is None else (os.fspath(launcher) or TRAIN_PY)
    steps, freq, freeze = (
        (2, 1, "backbone_interface") if smoke else (cfg.steps, cfg.logging_frequency, cfg.freeze_modules)
    )
    argv = [
        cfg.accelerate, "launch",
        "--config_file", DEEPSPEED_YAML,
        "--num_processes", str(cfg.num_processes),
        script,
        "--config_yaml", LIBERO_YAML,
        "--framework.cosmos25.base_model", os.fspath(cfg.cosmos_dir),
        "--datasets.vla_data.data_root_dir", cfg.data_dir,
        "--datasets.vla_data.data_mix", cfg.mixture,
        "--datasets.vla_data.per_device_batch_size", str(cfg.batch_size),
        "--trainer.pretrained_checkpoint", cfg.pretrained_checkpoint or os.fspath(cfg.released_checkpoint),
        "--trainer.freeze_modules", freeze,
        "--trainer.max_train_steps", str(steps),
        "--trainer.logging_frequency", str(freq),
    ]  # fmt: skip
    if not smoke and cfg.save_interval is not None:
        argv += ["--trainer.save_interval", str(cfg.save_interval)]
    argv += ["--run_root_dir", cfg.runs_dir, "--run_id", cfg.run_id]
    env = {"PYTHONPATH": cfg.checkout, "WANDB_MODE": "offline", "CUDA_VISIBLE_DEVICES": cfg.cuda, **RICH_WIDTH}
    title = "2-step training smoke test" if smoke else f"training, {steps} steps"
    return Command("train", title, argv, env, cfg.checkout, os.fspath(cfg.run_dir / TRAIN_LOG))


def serve_command(cfg: BridgeConfig) -> Command:
    """Upstream's websocket policy server on ``cfg.serve_checkpoint``."""
    cfg = cfg.resolved()
    argv = [cfg.model_python, SERVER_PY, "--ckpt_path", os.fspath(cfg.serve_checkpoint), "--port", str(cfg.port)]
    if cfg.use_bf16:
        argv.append("--use_bf16")
    argv += ["--idle_timeout", str(cfg.idle_timeout)]
    env = {"PYTHONPATH": cfg.checkout, "CUDA_VISIBLE_DEVICES": cfg.cuda}
    return Command("serve", "upstream policy server", argv, env, cfg.checkout, os.fspath(cfg.run_dir / SERVER_LOG))


def eval_command(cfg: BridgeConfig) -> Command:
    """Upstream's LIBERO client (``eval_libero.py``, tyro flags ``--args.<name-with-dashes>``)."""
    cfg = cfg.resolved()
    argv = [
        cfg.libero_python, EVAL_PY,
        "--args.pretrained-path", os.fspath(cfg.serve_checkpoint),
        "--args.host", "127.0.0.1",
        "--args.port", str(cfg.port),
        "--args.task-suite-name", cfg.suite,
        "--args.num-trials-per-task", str(cfg.trials),
        "--args.video-out-path", os.fspath(cfg.run_dir / "videos" / cfg.suite),
    ]  # fmt: skip
    pythonpath = cfg.checkout + (os.pathsep + cfg.libero_home if cfg.libero_home else "")
    env = {"PYTHONPATH": pythonpath, "MUJOCO_GL": "egl", **RICH_WIDTH}
    if cfg.libero_home:
        env = {"LIBERO_CONFIG_PATH": os.fspath(Path(cfg.libero_home) / "libero"), **env}
    log = os.fspath(cfg.run_dir / eval_log_name(cfg.suite))
    return Command("eval", "upstream LIBERO client (eval_libero.py)", argv, env, cfg.checkout, log)


def client_command(
    cfg: BridgeConfig, python: str | None = None, statistics_flag: str | None = "--statistics"
) -> Command:
    """This project's LIBERO client speaking upstream's request shape to the upstream server.

    ``statistics_flag``: the client's option that takes ``dataset_statistics.json`` (the one in the
    served checkpoint's run directory, ``<pt>.parents[1]``, which un-normalises the replies).
    """
    import sys

    cfg = cfg.resolved()
    argv = [
        python or sys.executable, "-m", "tutorial_utils", "eval",
        "--protocol", "dit4dit",
        "--policy", "dit4dit",
        "--host", "127.0.0.1",
        "--port", str(cfg.port),
        "--suite", cfg.suite,
        "--task-ids", cfg.task_ids,
        "--trials-per-task", str(cfg.trials),
        "--connect-timeout", str(cfg.connect_timeout),
        "--output-dir", os.fspath(cfg.run_dir),
    ]  # fmt: skip
    if statistics_flag:
        argv += [statistics_flag, os.fspath(cfg.serve_checkpoint.parents[1] / "dataset_statistics.json")]
    env = {"MUJOCO_GL": "egl"}
    log = os.fspath(cfg.run_dir / eval_log_name(cfg.suite))
    return Command("client", "this project's LIBERO client, dit4dit protocol", argv, env, os.fspath(cfg.run_dir), log)


def all_commands(cfg: BridgeConfig, smoke: bool = True) -> list[Command]:
    return [train_command(cfg, smoke), serve_command(cfg), eval_command(cfg), client_command(cfg)]


# --- commands.sh ----------------------------------------------------------------------------------


def render_commands_sh(cfg: BridgeConfig, smoke: bool = True) -> str:
    """The whole chain as one script: train, then the server in the background, then upstream's
    client (or this project's with ``CLIENT=ours``), then the server is stopped."""
    cfg = cfg.resolved()
    train, serve, ev, client = all_commands(cfg, smoke)
    head = [
        "#!/usr/bin/env bash",
        "# Generated by `python -m tutorial_utils bridge commands` (tutorial_utils.bridge.commands.dry_run).",
        "# The corrected DiT4DiT chain (upstream 0362b34, docs/FACTS.md section 11). Do not edit: regenerate.",
        "# Before step train: `python -m tutorial_utils bridge prepare ...` writes meta/modality.json into the",
        "# dataset and fixes the released config.yaml's Cosmos path; the mixture launcher is already written.",
        "# CLIENT=ours runs this project's Python 3.11 LIBERO client instead of upstream's eval_libero.py.",
        "set -euo pipefail",
        f"mkdir -p {shlex.quote(os.fspath(cfg.run_dir))}",
    ]
    parts = [
        train.shell(),
        serve.shell(background=True) + "\nSERVER_PID=$!\ntrap 'kill $SERVER_PID 2>/dev/null || true' EXIT",
        ev.shell(guard='[ "${CLIENT:-upstream}" = upstream ]'),
        client.shell(guard='[ "${CLIENT:-upstream}" = ours ]'),
    ]
    return "\n".join(head) + "\n\n" + "\n\n".join(parts) + "\n"


def dry_run(cfg: BridgeConfig, path: str | os.PathLike | None = None, smoke: bool = True) -> Path:
    """Write ``commands.sh`` (default: into the run directory) and the mixture launcher it runs;
    nothing is executed. Returns the script's path."""
    from tutorial_utils.bridge.launcher import mixture_entries, write_launcher
    from tutorial_utils.io import atomic_write_text

    cfg = cfg.resolved()
    cfg.check()
    write_launcher(cfg.run_dir, cfg.mixture, mixture_entries(cfg.dataset))
    out = Path(path) if path else cfg.run_dir / COMMANDS_SH
    atomic_write_text(out, render_commands_sh(cfg, smoke))
    out.chmod(0o755)
    return out


def parse_commands_sh(text: str) -> dict[str, Command]:
    """Read a ``commands.sh`` written by :func:`dry_run` back into ``{step: Command}`` (argv, env,
    cwd and log as the shell would see them)."""
    joined = text.replace("\\\n", " ")
    out: dict[str, Command] = {}
    current: Command | None = None
    inside = False
    for raw in joined.splitlines():
        line = raw.strip()
        if line.startswith("# step "):
            step, _, title = line[len("# step ") :].partition(": ")
            current = Command(step, title.split(" (log: ")[0], [])
            out[step] = current
        elif current is not None and (line == "(" or line.endswith("; then (")):
            inside = True
        elif line.startswith(")"):
            inside = False
        elif not inside or current is None or not line:
            continue
        elif line.startswith("cd "):
            current.cwd = shlex.split(line)[1]
        elif line.startswith("export "):
            for item in shlex.split(line)[1:]:
                k, _, v = item.partition("=")
                current.env[k] = v
        else:
            words = shlex.split(line)
            if len(words) >= 3 and words[-1] == "2>&1" and words[-3] == ">":
                current.log, words = words[-2], words[:-3]
            current.argv = words
    return out
