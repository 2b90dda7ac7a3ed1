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

from tutorial_utils.bridge.checkout import (
    DEEPSPEED_YAML,
    EVAL_PY,
    LIBERO_YAML,
    RECIPE_OVERRIDES,
    SERVER_PY,
    TRAIN_PY,
    client_flag,
)
from tutorial_utils.errors import ConfigError
from tutorial_utils.params import param
from tutorial_utils.sim.suites import LIBERO as SUITES

COMMANDS_SH = "commands.sh"
TRAIN_LOG = "train.log"
SERVER_LOG = "server.log"
COSMOS_DIRNAME = "Cosmos-Predict2.5-2B"
LIBERO_CONFIG_DIRNAME = "libero_config"
#: The websockets library's line once the server's port is bound (upstream logs ``server running``
#: before it binds); commands.sh and :mod:`tutorial_utils.bridge.run` wait for it.
SERVER_READY_LINE = "server listening on"
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
    checkout: str | None = param(
        None, "dit4dit: the upstream checkout root (holds DiT4DiT/, deployment/, examples/)", "backend"
    )
    models_dir: str | None = param(None, "dit4dit: folder holding dit4dit-model/ and Cosmos-Predict2.5-2B/", "backend")
    data_dir: str | None = param(
        None, "dit4dit: folder holding the dataset folders (upstream's data_root_dir)", "backend"
    )
    runs_dir: str | None = param(None, "where the new run directory goes (None: the project's runs/)", "backend")
    model_python: str | None = param(
        None,
        "dit4dit: the Python with upstream's packages, e.g. ~/envs/dit4dit/bin/python (None: `python` on PATH)",
        "backend",
    )
    accelerate: str | None = param(
        None,
        "dit4dit: upstream's accelerate executable (None: the one beside model_python, else "
        "`model_python -m accelerate.commands.launch`)",
        "backend",
    )
    libero_python: str | None = param(
        None, "dit4dit: the Python with LIBERO for upstream's client (None: this project's client)", "backend"
    )
    libero_home: str | None = param(
        None, "dit4dit: the LIBERO checkout root, put on the client's PYTHONPATH (None: LIBERO installed)", "backend"
    )
    num_processes: int = param(1, "dit4dit: training processes, one GPU each (accelerate --num_processes)", "backend")
    smoke: bool = param(
        False,
        "the smoke test under any profile: train 2 steps at batch 1 with a loss line each (evaluate: 1 trial per task)",
        "backend",
    )


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
    accelerate: str = param(
        "",
        "the accelerate executable of the model's environment (empty: the one beside model_python when that is a "
        "path, else `accelerate` on PATH)",
    )
    cuda_visible_devices: str | None = param(
        None, "CUDA_VISIBLE_DEVICES (None: inherited, else 0..num_processes-1: one GPU per training process)"
    )
    num_processes: int = param(1, "accelerate --num_processes (one GPU each)")
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
        devices = [d for d in self.cuda.split(",") if d.strip()]
        ids = ",".join(str(i) for i in range(self.num_processes))
        if len(devices) < self.num_processes:
            raise ConfigError(
                f"num_processes={self.num_processes} but CUDA_VISIBLE_DEVICES={self.cuda!r} shows {len(devices)} GPU(s): "
                "every training process needs its own GPU. Fix: list one device per process (export "
                f"CUDA_VISIBLE_DEVICES={ids}, or `bridge commands --cuda-visible-devices {ids}`), or unset "
                "CUDA_VISIBLE_DEVICES for 0..N-1."
            )

    def launch_argv(self) -> list[str]:
        """How to start ``accelerate launch`` in the model's environment: ``accelerate`` when given;
        else the ``accelerate`` beside ``model_python`` (a venv's or conda env's ``bin``), else
        ``model_python -m accelerate.commands.launch``; else ``accelerate`` on PATH."""
        if self.accelerate:
            return [self.accelerate, "launch"]
        if self.model_python and os.sep in self.model_python:
            sibling = Path(self.model_python).parent / "accelerate"
            if sibling.is_file():
                return [os.fspath(sibling), "launch"]
            return [self.model_python, "-m", "accelerate.commands.launch"]
        return ["accelerate", "launch"]

    def check_interpreters(self) -> None:
        """Refuse a bare ``python``/``accelerate`` that PATH resolves into this book's own environment:
        upstream's training and server need their own (torch 2.7, DeepSpeed, the Cosmos pipeline)."""
        chosen = {"model_python": self.model_python or "python", "accelerate": self.launch_argv()[0]}
        for name, value in chosen.items():
            found = book_env_executable(value)
            if found:
                raise ConfigError(
                    f"{name}={value!r} is {found}, this book's own environment, not upstream's: its Python has "
                    "neither DeepSpeed nor upstream's pinned packages. Fix: pass upstream's interpreter as a path "
                    "(-p model_python ~/envs/dit4dit/bin/python, `bridge commands --model-python ...`; the accelerate "
                    "beside it is used), or -p accelerate /path/to/upstream/bin/accelerate."
                )

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
        """The GPUs the training and the server see: given, else inherited, else one per process."""
        if self.cuda_visible_devices is not None:
            return self.cuda_visible_devices
        return os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(str(i) for i in range(max(1, self.num_processes)))

    @property
    def libero_config_dir(self) -> Path:
        """``LIBERO_CONFIG_PATH`` of upstream's client: a folder in the run directory whose
        ``config.yaml`` the ``libero-config`` step writes (LIBERO prompts on stdin without one)."""
        return self.run_dir / LIBERO_CONFIG_DIRNAME


def book_env_executable(name: str) -> str | None:
    """The path a bare command ``name`` resolves to on PATH when that is inside this book's own
    environment (the folder of ``sys.executable``), else None. A path is taken as meant."""
    import shutil
    import sys

    if not name or os.sep in name:
        return None
    found = shutil.which(name)
    if not found:
        return None
    book = {Path(sys.executable).parent.resolve(), (Path(sys.prefix) / "bin").resolve()}
    return found if Path(found).parent.resolve() in book else None


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
        ends it with ``&`` and ``exec``s the program, so that ``$!`` is the program itself and a
        ``kill $!`` stops it (without ``exec`` it stops only the subshell and the program outlives the
        script); ``guard`` is a shell condition the step runs under."""
        lines = [comment(f"step {self.step}: {self.title}" + (f" (log: {self.log})" if self.log else ""))]
        lines.append(f"if {guard}; then (" if guard else "(")
        if self.cwd:
            lines.append(f"  cd {shlex.quote(self.cwd)}")
        if self.env:
            lines.append("  export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items()))
        args = [shlex.quote(a) for a in self.argv]
        body = "  " + ("exec " if background else "") + args[0]
        for a in args[1:]:
            body += (" \\\n    " if a.startswith("--") or a.endswith(".py") else " ") + a
        if self.log:
            body += f" \\\n    > {shlex.quote(self.log)} 2>&1"
        lines += [body, (") &" if background else ")") + ("; fi" if guard else "")]
        return "\n".join(lines)


def comment(text: str) -> str:
    """``text`` as ONE shell comment line: a newline (or any other control character) in a path
    would end the comment and run the rest as a command, so each is written as its escape
    (``\\n``); every other byte is inert after ``#``."""
    safe = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
    return f"# {safe}"


# --- the commands ---------------------------------------------------------------------------------


def train_command(cfg: BridgeConfig, smoke: bool = True, launcher: str | os.PathLike | None = None) -> Command:
    """``accelerate launch`` of the mixture launcher (or ``train.py`` when ``launcher`` is ``""``).

    ``smoke``: 2 steps, loss every step, the whole backbone frozen (FACTS section 11). Otherwise
    ``cfg.steps``, ``cfg.logging_frequency``, ``cfg.freeze_modules``, ``cfg.save_interval`` and the
    official recipe's flow-matching settings (:data:`RECIPE_OVERRIDES`). ``CUDA_VISIBLE_DEVICES``
    lists one GPU per process (:attr:`BridgeConfig.cuda`).
    """
    from tutorial_utils.bridge.launcher import LAUNCHER_NAME

    cfg = cfg.resolved()
    script = os.fspath(cfg.run_dir / LAUNCHER_NAME) if launcher is None else (os.fspath(launcher) or TRAIN_PY)
    steps, freq, freeze = (
        (2, 1, "backbone_interface") if smoke else (cfg.steps, cfg.logging_frequency, cfg.freeze_modules)
    )
    argv = [
        *cfg.launch_argv(),
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
    if not smoke:
        for key, value in RECIPE_OVERRIDES:
            argv += [f"--{key}", value]
        if cfg.save_interval is not None:
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
        client_flag("pretrained_path"), os.fspath(cfg.serve_checkpoint),
        client_flag("host"), "127.0.0.1",
        client_flag("port"), str(cfg.port),
        client_flag("task_suite_name"), cfg.suite,
        client_flag("num_trials_per_task"), str(cfg.trials),
        client_flag("video_out_path"), os.fspath(cfg.run_dir / "videos" / cfg.suite),
    ]  # fmt: skip
    env = {
        "LIBERO_CONFIG_PATH": os.fspath(cfg.libero_config_dir),
        "PYTHONPATH": _libero_pythonpath(cfg, cfg.checkout),
        "MUJOCO_GL": "egl",
        **RICH_WIDTH,
    }
    log = os.fspath(cfg.run_dir / eval_log_name(cfg.suite))
    return Command("eval", "upstream LIBERO client (eval_libero.py)", argv, env, cfg.checkout, log)


def _libero_pythonpath(cfg: BridgeConfig, first: str = "") -> str:
    return os.pathsep.join(p for p in (first, cfg.libero_home) if p)


def libero_config_command(cfg: BridgeConfig) -> Command:
    """Write LIBERO's ``config.yaml`` into :attr:`BridgeConfig.libero_config_dir` with the client's
    own interpreter (paths from where *it* finds LIBERO, without importing it), so upstream's
    client never meets LIBERO's stdin prompt; an existing file is kept."""
    from tutorial_utils.bridge.files import LIBERO_CONFIG_SCRIPT

    cfg = cfg.resolved()
    argv = [cfg.libero_python, os.fspath(cfg.run_dir / LIBERO_CONFIG_SCRIPT), os.fspath(cfg.libero_config_dir)]
    env = {"PYTHONPATH": _libero_pythonpath(cfg)} if cfg.libero_home else {}
    log = os.fspath(cfg.run_dir / "libero_config.log")
    return Command("libero-config", "LIBERO's config.yaml for upstream's client (no prompt)", argv, env, "", log)


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
    return [
        train_command(cfg, smoke),
        serve_command(cfg),
        libero_config_command(cfg),
        eval_command(cfg),
        client_command(cfg),
    ]


# --- commands.sh ----------------------------------------------------------------------------------


_WAIT_FOR_SERVER = (
    """\
wait_for_server() {  # until the server logs that its port is bound; an error if it exits or times out
  local log="$1" limit="$2" t=0
  while ! grep -q 'SERVER_READY_LINE' "$log" 2>/dev/null; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "error: the policy server exited before listening; read $log" >&2; exit 1
    fi
    if [ "$t" -ge "$limit" ]; then
      echo "error: the policy server did not listen within $limit s; read $log" >&2; exit 1
    fi
    sleep 1; t=$((t + 1))
  done
}"""
).replace("SERVER_READY_LINE", SERVER_READY_LINE)


def render_commands_sh(cfg: BridgeConfig, smoke: bool = True, ready_timeout: int = 600) -> str:
    """The whole chain as one script: train, then the server in the background, a wait until it
    listens, LIBERO's ``config.yaml`` and upstream's client (or this project's with
    ``CLIENT=ours``), then the server is stopped. Every value is quoted with :func:`shlex.quote`
    and comments cannot be broken by a newline (:func:`comment`)."""
    cfg = cfg.resolved()
    train, serve, libero_cfg, ev, client = all_commands(cfg, smoke)
    upstream = '[ "${CLIENT:-upstream}" = upstream ]'
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
        serve.shell(background=True)
        + "\nSERVER_PID=$!\ntrap 'kill $SERVER_PID 2>/dev/null || true' EXIT\n"
        + _WAIT_FOR_SERVER
        + f"\nwait_for_server {shlex.quote(serve.log)} {int(ready_timeout)}",
        libero_cfg.shell(guard=upstream),
        ev.shell(guard=upstream),
        client.shell(guard='[ "${CLIENT:-upstream}" = ours ]'),
    ]
    return "\n".join(head) + "\n\n" + "\n\n".join(parts) + "\n"


def dry_run(cfg: BridgeConfig, path: str | os.PathLike | None = None, smoke: bool = True) -> Path:
    """Write ``commands.sh`` (default: into the run directory) and the two scripts it runs (the
    mixture launcher, LIBERO's config writer); nothing is executed. Returns the script's path."""
    from tutorial_utils.bridge.files import write_libero_config_script
    from tutorial_utils.bridge.launcher import mixture_entries, write_launcher
    from tutorial_utils.io import atomic_write_text

    cfg = cfg.resolved()
    cfg.check()
    cfg.check_interpreters()
    out = Path(path) if path else cfg.run_dir / COMMANDS_SH
    text = render_commands_sh(cfg, smoke)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a path with bytes that are not UTF-8 (they reach Python as surrogates)
        bad = next(
            (
                f"{f}={getattr(cfg, f)!r}"
                for f in cfg.__dataclass_fields__
                if exc.object[exc.start] in str(getattr(cfg, f))
            ),
            repr(exc.object[max(0, exc.start - 40) : exc.end + 40]),
        )
        raise ConfigError(
            f"{bad}: holds a byte that is not UTF-8, which commands.sh cannot quote faithfully. Fix: rename the "
            "folder (or pick a run_id) with UTF-8 characters only."
        ) from None
    write_launcher(cfg.run_dir, cfg.mixture, mixture_entries(cfg.dataset))
    write_libero_config_script(cfg.run_dir)
    atomic_write_text(out, text)
    out.chmod(0o755)
    return out


def _logical_lines(text: str) -> list[str]:
    """The script's lines as bash reads them: a backslash-newline outside single quotes joins two
    lines, a newline inside quotes belongs to its word, a comment runs to the end of its line.
    (:func:`shlex.quote` writes single-quoted words, whose every byte is literal.)"""
    out: list[str] = []
    buf: list[str] = []
    quote = ""  # "'" or '"' while inside quotes
    word_start = True
    i = 0
    while i < len(text):
        ch = text[i]
        if quote == "'":
            quote = "" if ch == "'" else quote
            buf.append(ch)
        elif ch == "\\" and i + 1 < len(text):
            if text[i + 1] == "\n":  # a line continuation: bash removes both characters
                i += 2
                continue
            buf.append(text[i : i + 2])
            i += 2
            word_start = False
            continue
        elif quote == '"':
            quote = "" if ch == '"' else quote
            buf.append(ch)
        elif ch in "'\"":
            quote = ch
            buf.append(ch)
        elif ch == "#" and word_start:  # a comment: to the end of the line, quotes and all
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            buf.append(text[i:end])
            i = end
            continue
        elif ch == "\n":
            out.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
        word_start = quote == "" and ch in " \t\n;&|()"
        i += 1
    if buf:
        out.append("".join(buf))
    return out


def parse_commands_sh(text: str) -> dict[str, Command]:
    """Read a ``commands.sh`` written by :func:`dry_run` back into ``{step: Command}`` (argv, env,
    cwd and log as the shell would see them)."""
    out: dict[str, Command] = {}
    current: Command | None = None
    inside = False
    for raw in _logical_lines(text):
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
            current.argv = words[1:] if words[:1] == ["exec"] else words  # a background step execs its program
    return out
