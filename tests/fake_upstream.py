"""A fake upstream DiT4DiT checkout for the bridge's tests: :func:`write_fake_checkout`.

Small scripts at upstream's paths (upstream ``0362b34``, docs/FACTS.md section 11) that record their
argv, working directory and environment into ``<checkout>/.fake_records/<name>.json``, enforce
upstream's contracts with its exact error texts, and log through a real
``rich.logging.RichHandler`` on the root logger as upstream's ``overwatch.py`` configures it:

- ``DiT4DiT/training/train.py``: ``--config_yaml`` + ``--a.b v`` dotlist overrides; needs
  ``PYTHONPATH`` (``ModuleNotFoundError: No module named 'DiT4DiT'``), the checkout root as its
  directory (it opens ``DiT4DiT/config/deepseeds/ds_config.yaml``), accelerate's process group
  (``Default process group has not been initialized``), ``WANDB_MODE=offline``, a Cosmos folder
  with ``model_index.json``, a known mixture (``KeyError: '<name>'``), ``meta/modality.json``
  in each dataset (``AssertionError: Please provide a meta/modality.json file in <path>``);
  writes ``meta/stats_gr00t.json``, ``<run>/dataset_statistics.json``, the loss lines and
  ``final_model/pytorch_model.pt``.
- ``deployment/model_server/server_policy.py``: plain ``logging.basicConfig``; reads
  ``config.yaml`` and ``dataset_statistics.json`` at ``<pt>.parents[1]`` (``Missing `config.yaml`
  for `run_dir = ...```), checks the Cosmos folder in that config, then serves msgpack-numpy over
  websockets and replies ``data.normalized_actions`` (1, 8, 8); stops after ``--idle_timeout``.
- ``examples/LIBERO/eval_files/eval_libero.py``: tyro-style ``--args.*`` flags; connects (with
  upstream's timeout error), sends upstream's request shape for each episode of a stand-in
  environment (no LIBERO), logs upstream's client lines.
- ``bin/accelerate``: an ``accelerate launch`` stand-in that sets the process-group environment
  and runs the script with this Python (put ``<checkout>/bin`` on ``PATH``).

Everything is written by this module; nothing is copied from upstream.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

RECORDS = ".fake_records"
MIXTURE_TEXT = '''"""Fake upstream mixtures registry."""

DATASET_NAMED_MIXTURES = {
    "libero_all": [
        ("libero_object_no_noops_1.0.0_lerobot", 1.0, "libero_franka"),
        ("libero_goal_no_noops_1.0.0_lerobot", 1.0, "libero_franka"),
        ("libero_spatial_no_noops_1.0.0_lerobot", 1.0, "libero_franka"),
        ("libero_10_no_noops_1.0.0_lerobot", 1.0, "libero_franka"),
    ],
}
'''

_RECORD = """
def _record(name):
    import json as _json, os as _os, sys as _sys
    from pathlib import Path as _Path

    root = _Path(__file__).resolve().parents[{depth}]
    keys = ("PYTHONPATH", "WANDB_MODE", "CUDA_VISIBLE_DEVICES", "WORLD_SIZE", "RANK", "LOCAL_RANK",
            "MASTER_ADDR", "LIBERO_CONFIG_PATH", "MUJOCO_GL", "HF_TOKEN", "KEEP_FINAL_MODEL", "FAKE_ENV")
    out = root / ".fake_records"
    out.mkdir(exist_ok=True)
    data = {{"argv": _sys.argv, "cwd": _os.getcwd(), "env": {{k: _os.environ.get(k) for k in keys}},
             "python": _sys.executable, "pid": _os.getpid()}}
    (out / f"{{name}}.json").write_text(_json.dumps(data, indent=2))
"""

_OVERWATCH = '''"""Fake overwatch: Rich on the root logger, configured the way upstream configures it."""
import logging
import logging.config

LOG_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"simple-console": {"format": "| >> %(message)s", "datefmt": "%m/%d [%H:%M:%S]"}},
    "handlers": {
        "console": {
            "class": "rich.logging.RichHandler",
            "formatter": "simple-console",
            "markup": True,
            "rich_tracebacks": True,
            "show_level": True,
            "show_path": True,
            "show_time": True,
        }
    },
    "root": {"level": "INFO", "handlers": ["console"]},
}
logging.config.dictConfig(LOG_CONFIG)
'''

_MSGPACK = '''"""Fake msgpack-numpy codec (the openpi framing)."""
import msgpack
import numpy as np


def _pack(obj):
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


def _unpack(obj):
    if b"__ndarray__" in obj:
        return np.ndarray(buffer=obj[b"data"], dtype=np.dtype(obj[b"dtype"]), shape=obj[b"shape"])
    if b"__npgeneric__" in obj:
        return np.dtype(obj[b"dtype"]).type(obj[b"data"])
    return obj


def packb(obj):
    return msgpack.packb(obj, default=_pack)


def unpackb(data):
    return msgpack.unpackb(data, object_hook=_unpack, raw=False)
'''

_SHARE_TOOLS = '''"""Fake share_tools: config.yaml and dataset_statistics.json at <pt>.parents[1]."""
import json
import logging
import os
from pathlib import Path

import yaml


def read_mode_config(pretrained_checkpoint):
    if os.path.isfile(pretrained_checkpoint):
        checkpoint_pt = Path(pretrained_checkpoint)
        logging.info(f"Loading from local checkpoint path `{checkpoint_pt}`")
        assert checkpoint_pt.suffix == ".pt"
        run_dir = checkpoint_pt.parents[1]
        config_yaml, dataset_statistics_json = run_dir / "config.yaml", run_dir / "dataset_statistics.json"
        assert config_yaml.exists(), f"Missing `config.yaml` for `{run_dir = }`"
        assert dataset_statistics_json.exists(), f"Missing `dataset_statistics.json` for `{run_dir = }`"
        with open(config_yaml) as f:
            cfg = yaml.safe_load(f)
        with open(dataset_statistics_json) as f:
            stats = json.load(f)
        return cfg, stats
    raise FileNotFoundError(f"Pretrained checkpoint `{pretrained_checkpoint}` does not exist.")


def build_cosmos(base_model):
    """The framework build loads a diffusers pipeline from a local folder (local_files_only)."""
    if not os.path.isfile(os.path.join(str(base_model), "model_index.json")):
        raise OSError(f"Error no file named model_index.json found in directory {base_model}.")
    logging.info(f"Loaded Cosmos pipeline from {base_model}")
'''

_FRAMEWORK_INIT = '''"""Fake framework registry."""
import logging

logger = logging.getLogger(__name__)

try:
    from DiT4DiT.model.framework import share_tools  # noqa: F401
except Exception as e:  # pragma: no cover
    logger.warning(f"Failed to auto-import framework submodules: {e}")
'''

_DATASETS = '''"""Fake GR00T-style dataset checks."""
import json
from pathlib import Path

LE_ROBOT_MODALITY_FILENAME = "meta/modality.json"


def check_dataset(dataset_path):
    dataset_path = Path(dataset_path)
    modality_meta_path = dataset_path / LE_ROBOT_MODALITY_FILENAME
    assert modality_meta_path.exists(), f"Please provide a {LE_ROBOT_MODALITY_FILENAME} file in {dataset_path}"
    stats = dataset_path / "meta" / "stats_gr00t.json"
    if not stats.exists():
        stats.write_text(json.dumps({"action": {"min": [-1.0] * 7, "max": [1.0] * 7}}))
    info = json.loads((dataset_path / "meta" / "info.json").read_text())
    return int(info.get("total_frames", 0))
'''

_LEROBOT_DATASETS = '''"""Fake mixture loader."""
from pathlib import Path

from DiT4DiT.dataloader.gr00t_lerobot.datasets import check_dataset
from DiT4DiT.dataloader.gr00t_lerobot.mixtures import DATASET_NAMED_MIXTURES


def get_vla_dataset(data_root_dir, data_mix):
    mixture_spec = DATASET_NAMED_MIXTURES[data_mix]
    frames = 0
    for d_name, d_weight, robot_type in mixture_spec:
        frames += check_dataset(Path(data_root_dir) / d_name)
    return frames
'''

_TRAIN = '''"""Fake DiT4DiT/training/train.py."""
{record}
_record("train")

import argparse
import json
import logging
import os
from pathlib import Path

import yaml

from DiT4DiT.training.trainer_utils import overwatch  # noqa: F401  (Rich on the root logger)
from DiT4DiT.model.framework import share_tools
from DiT4DiT.dataloader.lerobot_datasets import get_vla_dataset

open("DiT4DiT/config/deepseeds/ds_config.yaml").close()  # relative: run from the checkout root
logger = logging.getLogger(__name__)


def _barrier():
    if not os.environ.get("WORLD_SIZE") or not os.environ.get("MASTER_ADDR"):
        raise ValueError("Default process group has not been initialized, please make sure to call init_process_group.")


def _set(cfg, dotted, value):
    node = cfg
    parts = dotted.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {{}})
    node[parts[-1]] = value


def normalize_dotlist_args(args):
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            if "=" in a:
                out.append(a[2:])
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                out.append(f"{{a[2:]}}={{args[i + 1]}}")
                i += 1
            else:
                out.append(f"{{a[2:]}}=true")
        i += 1
    return out


def main(cfg):
    output_dir = Path(cfg["run_root_dir"]) / cfg["run_id"]
    (output_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    _barrier()
    logger.info("Building framework DiT4DiT")
    share_tools.build_cosmos(cfg["framework"]["cosmos25"]["base_model"])
    data = cfg["datasets"]["vla_data"]
    frames = get_vla_dataset(data["data_root_dir"], data["data_mix"])
    (output_dir / "dataset_statistics.json").write_text(json.dumps(
        {{"franka": {{"action": {{"min": [-1.0] * 7, "max": [1.0] * 7, "mask": [True] * 6 + [False]}},
                    "num_transitions": frames}}}}))
    pretrained = cfg["trainer"].get("pretrained_checkpoint")
    if pretrained and not os.path.isfile(str(pretrained)):
        raise FileNotFoundError(f"Pretrained checkpoint `{{pretrained}}` does not exist.")
    if pretrained:
        logger.info(f"Loaded pretrained checkpoint: {{pretrained}}, steps: 0")
    total, trainable = 2_158_073_544, 163_073_544
    logger.info("=" * 80)
    logger.info(f"  Total parameters:      {{total:,}} ({{total / 10**6:.3f}}M)")
    logger.info(f"  Trainable parameters:  {{trainable:,}} ({{trainable / 10**6:.3f}}M)")
    logger.info(f"  Frozen parameters:     {{total - trainable:,}} ({{(total - trainable) / 10**6:.3f}}M)")
    logger.info(f"  Trainable ratio:       {{trainable / total * 100:.2f}}%")
    if os.environ.get("WANDB_MODE") != "offline" and not os.environ.get("WANDB_API_KEY"):
        raise RuntimeError("api_key not configured (no-tty). call wandb.login(key=[your_api_key])")
    steps = int(cfg["trainer"]["max_train_steps"])
    batch = int(data.get("per_device_batch_size", 1))
    logger.info(f"  Total optimization steps = {{steps}}")
    logger.info(f"  len(vla_train_dataloader) = {{max(1, frames // batch)}}")
    freq = int(cfg["trainer"]["logging_frequency"])
    save_every = int(cfg["trainer"].get("save_interval", 5000))
    for step in range(1, steps + 1):
        if step % freq == 0:
            metrics = {{"action_dit_loss": 1.0 / step, "future_video_loss": 0.5, "future_video_loss_scaled": 0.05,
                       "total_loss": 1.0 / step + 0.05, "data_time": 0.01, "model_time": 0.1,
                       "learning_rate/action_model": 1e-4, "epoch": 0.0}}
            logger.info(f"[Exp: {{cfg['run_id']}}] Step {{step}}, Loss: {{metrics}})")
        if step % save_every == 0:
            (output_dir / "checkpoints" / f"steps_{{step}}_pytorch_model.pt").write_bytes(b"fake")
            (output_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    final_checkpoint = os.path.join(str(output_dir), "final_model")
    os.makedirs(final_checkpoint, exist_ok=True)
    Path(final_checkpoint, "pytorch_model.pt").write_bytes(b"\\0" * 4096)
    logger.info(f"Training complete. Final model saved at {{final_checkpoint}}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--config_yaml", type=str, default="xxx.yaml", help="Path to YAML config")
    args, clipargs = parser.parse_known_args()
    with open(args.config_yaml) as f:
        cfg = yaml.safe_load(f)
    for item in normalize_dotlist_args(clipargs):  # OmegaConf.from_dotlist + merge
        key, _, raw = item.partition("=")
        _set(cfg, key, yaml.safe_load(raw) if raw else raw)
    main(cfg)
'''

_SERVER = '''"""Fake deployment/model_server/server_policy.py."""
{record}
_record("server")

import argparse
import logging
import os
import threading
import time

import numpy as np
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import serve

from deployment.model_server.tools import msgpack_numpy
from DiT4DiT.model.framework.share_tools import build_cosmos, read_mode_config


def _check(obs):
    ex = obs["examples"][0]
    img, state = ex["image"], np.asarray(ex["state"])
    # upstream's predict_action takes a list of frames, or one frame it wraps in a list
    frames = list(img) if isinstance(img, (list, tuple)) else [img]
    for f in frames:
        assert isinstance(f, np.ndarray) and f.shape == (224, 448, 3) and f.dtype == np.uint8, (
            f"image frame {{type(f).__name__}} {{getattr(f, 'shape', None)}} {{getattr(f, 'dtype', None)}}: "
            "expected (224, 448, 3) uint8 (primary and wrist side by side)"
        )
    assert state.shape == (1, 16), f"state {{state.shape}}"
    assert isinstance(ex["lang"], str)


def main(args):
    cfg, stats = read_mode_config(args.ckpt_path)
    build_cosmos(cfg["framework"]["cosmos25"]["base_model"])
    actions = np.tanh(np.linspace(-2, 2, 64, dtype=np.float32)).reshape(1, 8, 8)
    last = [time.time()]

    def handler(ws):
        addr = ws.remote_address
        logging.info(f"Connection from {{addr}} opened")
        ws.send(msgpack_numpy.packb({{"env": "simpler_env"}}))
        try:
            for msg in ws:
                last[0] = time.time()
                try:
                    obs = msgpack_numpy.unpackb(msg)
                    _check(obs)
                    ws.send(msgpack_numpy.packb({{"status": "ok", "data": {{"normalized_actions": actions}}}}))
                except Exception as e:
                    import traceback
                    ws.send(traceback.format_exc())
                    logging.error(f"request failed: {{e}}")
        except ConnectionClosed:
            pass
        finally:
            logging.info(f"Connection from {{addr}} closed")

    logging.info("server running ...")
    time.sleep(float(os.environ.get("FAKE_SERVER_DELAY", "0")))  # loading the model takes a while upstream
    with serve(handler, "0.0.0.0", args.port, compression=None, max_size=None) as server:
        if args.idle_timeout > 0:
            def watch():
                while time.time() - last[0] < args.idle_timeout:
                    time.sleep(0.2)
                logging.info(f"Idle timeout ({{args.idle_timeout}}s) reached, shutting down server.")
                server.shutdown()
            threading.Thread(target=watch, daemon=True).start()
        server.serve_forever()


def build_argparser():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt_path", type=str, default="Qwen/Qwen2.5-VL-3B-Instruct")
    parser.add_argument("--port", type=int, default=10093)
    parser.add_argument("--use_bf16", action="store_true")
    parser.add_argument("--idle_timeout", type=int, default=1800)
    return parser


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, force=True)
    main(build_argparser().parse_args())
'''

_WS_CLIENT = '''"""Fake websocket policy client."""
import logging
import os
import time

import websockets.sync.client

from deployment.model_server.tools import msgpack_numpy


class WebsocketClientPolicy:
    def __init__(self, host="127.0.0.1", port=10093):
        self._uri = f"ws://{host}:{port}"
        self._ws, self._meta = self._wait_for_server(float(os.environ.get("FAKE_UPSTREAM_CONNECT_TIMEOUT", 300)))

    def _wait_for_server(self, timeout=300):
        logging.info(f"Waiting for server at {self._uri}...")
        start = time.time()
        while True:
            if time.time() - start > timeout:
                raise TimeoutError(f"Failed to connect to server within {timeout} seconds")
            try:
                conn = websockets.sync.client.connect(
                    self._uri,
                    compression=None,
                    max_size=None,
                    open_timeout=150,
                    ping_interval=20,
                    ping_timeout=20,
                )
                return conn, msgpack_numpy.unpackb(conn.recv())
            except (ConnectionRefusedError, OSError):
                time.sleep(0.2)

    def infer(self, obs):
        self._ws.send(msgpack_numpy.packb(obs))
        response = self._ws.recv()
        if isinstance(response, str):
            raise RuntimeError(f"Error in inference server:\\n{response}")
        return msgpack_numpy.unpackb(response)
'''

_INTERFACE = '''"""Fake model2libero_interface."""
import numpy as np

from deployment.model_server.tools.websocket_policy_client import WebsocketClientPolicy


class ModelClient:
    def __init__(self, host: str, port: int, image_size: list[int] = [224, 224]):
        self.client = WebsocketClientPolicy(host, port)

    def step(self, lang) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        obs = {"examples": [{"image": [np.zeros((224, 448, 3), np.uint8)], "lang": lang,
                             "state": np.zeros((1, 16), np.float32)}]}
        return self.client.infer(obs)["data"]["normalized_actions"]
'''

_EVAL = '''"""Fake examples/LIBERO/eval_files/eval_libero.py (a stand-in environment; LIBERO imported for its config)."""
{record}
_record("eval")

import argparse
import dataclasses
import inspect
import logging
import types
import typing

import numpy as np

from DiT4DiT.training.trainer_utils import overwatch  # noqa: F401  (Rich on the root logger)
from examples.LIBERO.eval_files.model2libero_interface import ModelClient


def _tyro_cli(fn):
    """tyro's naming: one dataclass parameter `p` gives the flags --p.<field-with-dashes>."""
    (name, _), = inspect.signature(fn).parameters.items()
    cls = typing.get_type_hints(fn)[name]
    parser = argparse.ArgumentParser()
    for f in dataclasses.fields(cls):
        parser.add_argument(f"--{{name}}.{{f.name.replace('_', '-')}}", dest=f.name, type=f.type, default=f.default)
    return fn(cls(**vars(parser.parse_args())))


tyro = types.SimpleNamespace(cli=_tyro_cli)


@dataclasses.dataclass
class Args:
    host: str = "127.0.0.1"
    port: int = 10093
    task_suite_name: str = "libero_goal"
    num_trials_per_task: int = 50
    video_out_path: str = "experiments/libero/logs"
    pretrained_path: str = ""
    seed: int = 7


def _binarize_gripper_open(open_val: np.ndarray | float) -> np.ndarray:
    return np.asarray([1.0 - 2.0 * (float(np.asarray(open_val).reshape(-1)[0]) > 0.5)], np.float32)


def eval_libero(args: Args) -> None:
    from libero.libero import benchmark  # noqa: F401  (LIBERO reads, or asks for, its config.yaml here)

    client = ModelClient(args.host, int(args.port))
    n, ok = int(args.num_trials_per_task), 0
    logging.info(f"Task suite: {{args.task_suite_name}}")
    for task in ("pick up the black bowl and place it on the plate",):
        logging.info(f"\\nTask: {{task}}")
        for ep in range(n):
            logging.info(f"Starting episode {{ep + 1}}...")
            actions = client.step(task)
            assert np.asarray(actions).shape == (1, 8, 8)
            done = False
            logging.info(f"Success: {{done}}")
            logging.info(f"# episodes completed so far: {{ep + 1}}")
            logging.info(f"# successes: {{ok}} ({{ok / (ep + 1) * 100:.1f}}%)")
        logging.info(f"Current task success rate: {{ok / n}}")
        logging.info(f"Current total success rate: {{ok / n}}")
    logging.info(f"Total success rate: {{ok / n}}")
    logging.info(f"Total episodes: {{n}}")


if __name__ == "__main__":
    tyro.cli(eval_libero)
'''

_ACCELERATE = '''#!{python}
"""Fake `accelerate launch`: records itself, gives each rank its own GPU as accelerate does (rank r
uses the r-th visible device: too few visible devices is CUDA's `invalid device ordinal`), and runs
the script with the Python of its own environment (the `python` beside it, else this one)."""
import json
import os
import sys

args = sys.argv[1:]
if not args or args[0] != "launch":
    sys.exit("fake accelerate: only `accelerate launch` is supported")
args = args[1:]
opts = {{}}
while args and args[0].startswith("--"):
    opts[args[0]] = args[1]
    args = args[2:]
here = os.path.dirname(os.path.abspath(__file__))
rec = os.environ.get("FAKE_ACCELERATE_RECORD")
if rec:
    with open(rec, "w") as fh:
        json.dump({{"accelerate": os.path.abspath(__file__), "opts": opts, "fake_env": os.environ.get("FAKE_ENV"),
                   "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}}, fh)
cfg = opts.get("--config_file")
if cfg and not os.path.isfile(cfg):
    sys.exit(f"fake accelerate: config file {{cfg}} not found (relative to {{os.getcwd()}})")
n = int(opts.get("--num_processes", "1"))
visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
if "CUDA_VISIBLE_DEVICES" in os.environ and len(visible) < n:
    sys.exit(f"RuntimeError: CUDA error: invalid device ordinal (rank {{len(visible)}} of {{n}}, "
             f"CUDA_VISIBLE_DEVICES={{os.environ['CUDA_VISIBLE_DEVICES']!r}})")
python = os.path.join(here, "python") if os.path.isfile(os.path.join(here, "python")) else sys.executable
env = dict(os.environ, WORLD_SIZE=str(n), RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
os.execve(python, [python, *args], env)
'''

_LIBERO_INIT = '''"""Fake LIBERO (libero/libero/__init__.py): reads $LIBERO_CONFIG_PATH/config.yaml, or asks on stdin."""
import os

import yaml

libero_config_path = os.environ.get("LIBERO_CONFIG_PATH", os.path.expanduser("~/.libero"))
config_file = os.path.join(libero_config_path, "config.yaml")
if not os.path.exists(config_file):
    print("Initializing the default config file...")
    print(f"The following information is stored in the config file: {config_file}")
    answer = input("Do you want to specify a custom path for the dataset folder? (Y/N): ")
    raise SystemExit("fake LIBERO: a person answered the prompt; a script must not get here")
with open(config_file) as f:
    _config = yaml.safe_load(f)
for _key in ("benchmark_root", "bddl_files", "init_states", "assets"):
    assert os.path.isdir(_config[_key]), f"LIBERO config {config_file}: {_key} {_config[_key]} is not a folder"
'''

_LIBERO_YAML = """run_id: dit4dit
run_root_dir: results/Checkpoints
seed: 42
framework:
  name: DiT4DiT
  cosmos25:
    extract_layer: 17
    base_model: /path/to/Cosmos-Predict2.5-2B
    flow_matching:
      time_distribution: logit_normal
      high_sigma_ratio: 0.05
      high_sigma_min: 0.98
  action_model:
    action_dim: 8
    state_dim: 16
    action_horizon: 8
datasets:
  vla_data:
    dataset_py: lerobot_datasets
    data_root_dir: /path/to/dataset/libero
    data_mix: libero_all
    per_device_batch_size: 4
trainer:
  max_train_steps: 100000
  save_interval: 5000
  eval_interval: 100
  freeze_modules: ''
  logging_frequency: 10
"""

_MODALITY = {
    "state": {
        **{k: {"start": i, "end": i + 1} for i, k in enumerate(["x", "y", "z", "roll", "pitch", "yaw"])},
        "pad": {"start": 6, "end": 7},
        "gripper": {"start": 7, "end": 8},
    },
    "action": {
        **{k: {"start": i, "end": i + 1} for i, k in enumerate(["x", "y", "z", "roll", "pitch", "yaw"])},
        "gripper": {"start": 6, "end": 7},
    },
    "video": {
        "primary_image": {"original_key": "observation.images.image"},
        "wrist_image": {"original_key": "observation.images.wrist_image"},
    },
    "annotation": {"human.action.task_description": {"original_key": "task_index"}},
}


def _files() -> dict[str, str]:
    rec = _RECORD.format
    return {
        "DiT4DiT/__init__.py": "",
        "DiT4DiT/training/__init__.py": "",
        "DiT4DiT/training/trainer_utils/__init__.py": "",
        "DiT4DiT/training/trainer_utils/overwatch.py": _OVERWATCH,
        "DiT4DiT/training/train.py": _TRAIN.format(record=rec(depth=2)),
        "DiT4DiT/config/libero/dit4dit_libero.yaml": _LIBERO_YAML,
        "DiT4DiT/config/deepseeds/deepspeed_zero2.yaml": "distributed_type: DEEPSPEED\nnum_processes: 1\n",
        "DiT4DiT/config/deepseeds/ds_config.yaml": "zero_optimization:\n  stage: 2\n",
        "DiT4DiT/dataloader/__init__.py": "",
        "DiT4DiT/dataloader/lerobot_datasets.py": _LEROBOT_DATASETS,
        "DiT4DiT/dataloader/gr00t_lerobot/__init__.py": "",
        "DiT4DiT/dataloader/gr00t_lerobot/mixtures.py": MIXTURE_TEXT,
        "DiT4DiT/dataloader/gr00t_lerobot/datasets.py": _DATASETS,
        "DiT4DiT/dataloader/gr00t_lerobot/data_config.py": 'ROBOT_TYPE_CONFIG_MAP = {"libero_franka": "LiberoFrankaConfig"}\n',
        "DiT4DiT/model/__init__.py": "",
        "DiT4DiT/model/framework/__init__.py": _FRAMEWORK_INIT,
        "DiT4DiT/model/framework/share_tools.py": _SHARE_TOOLS,
        "deployment/__init__.py": "",
        "deployment/model_server/__init__.py": "",
        "deployment/model_server/server_policy.py": _SERVER.format(record=rec(depth=2)),
        "deployment/model_server/tools/__init__.py": "",
        "deployment/model_server/tools/msgpack_numpy.py": _MSGPACK,
        "deployment/model_server/tools/websocket_policy_client.py": _WS_CLIENT,
        "examples/__init__.py": "",
        "examples/LIBERO/__init__.py": "",
        "examples/LIBERO/eval_files/__init__.py": "",
        "examples/LIBERO/eval_files/eval_libero.py": _EVAL.format(record=rec(depth=3)),
        "examples/LIBERO/eval_files/model2libero_interface.py": _INTERFACE,
        "examples/LIBERO/train_files/modality.json": json.dumps(_MODALITY, indent=4) + "\n",
    }


def write_fake_checkout(root: str | os.PathLike) -> Path:
    """Write the fake checkout into ``root`` (created); returns it. ``<root>/bin`` holds the
    ``accelerate`` stand-in."""
    root = Path(root)
    for rel, text in _files().items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text) if not text.startswith(" ") else text, encoding="utf-8")
    acc = root / "bin" / "accelerate"
    acc.parent.mkdir(exist_ok=True)
    acc.write_text(_ACCELERATE.format(python=sys.executable))
    acc.chmod(0o755)
    return root


def write_fake_libero(root: str | os.PathLike) -> Path:
    """A LIBERO checkout at ``root`` (pass it as ``libero_home``): ``import libero.libero`` reads
    ``$LIBERO_CONFIG_PATH/config.yaml`` and, without it, asks on stdin as LIBERO does."""
    root = Path(root)
    pkg = root / "libero" / "libero"
    for sub in ("bddl_files", "init_files", "assets"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
    (root / "libero" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(_LIBERO_INIT)
    (pkg / "benchmark.py").write_text('"""Fake LIBERO benchmark registry."""\n')
    return root


def write_fake_env(root: str | os.PathLike, name: str, accelerate: bool = False) -> Path:
    """A second Python environment at ``root``: ``bin/python`` runs this interpreter with
    ``FAKE_ENV=<name>`` (the fake scripts record it), and with ``accelerate`` a ``bin/accelerate``
    that runs scripts with that ``python``. Returns the ``python`` path."""
    bin_dir = Path(root) / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    py = bin_dir / "python"
    py.write_text(f'#!/bin/sh\nFAKE_ENV={name} exec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    if accelerate:
        acc = bin_dir / "accelerate"
        acc.write_text(f'#!/bin/sh\nFAKE_ENV={name} exec "{sys.executable}" "$(dirname "$0")/_accelerate.py" "$@"\n')
        acc.chmod(0o755)
        (bin_dir / "_accelerate.py").write_text(_ACCELERATE.format(python=sys.executable))
    return py


def write_fake_models(models_dir: str | os.PathLike, cosmos_placeholder: str = "/path/to/Cosmos-Predict2.5-2B") -> Path:
    """A models folder as the Hub downloads leave it: the released checkpoint (its ``config.yaml``
    still pointing at the authors' Cosmos folder) and the Cosmos folder with ``model_index.json``."""
    import yaml

    models = Path(models_dir)
    run = models / "dit4dit-model" / "dit4dit_libero"
    (run / "final_model").mkdir(parents=True, exist_ok=True)
    (run / "final_model" / "pytorch_model.pt").write_bytes(b"\0" * 1024)
    cfg = yaml.safe_load(_LIBERO_YAML)
    cfg["framework"]["cosmos25"]["base_model"] = cosmos_placeholder
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    (run / "dataset_statistics.json").write_text(
        json.dumps({"franka": {"action": {"min": [-1.0] * 7, "max": [1.0] * 7, "mask": [True] * 6 + [False]}}})
    )
    cosmos = models / "Cosmos-Predict2.5-2B"
    cosmos.mkdir(parents=True, exist_ok=True)
    (cosmos / "model_index.json").write_text('{"_class_name": "Cosmos2_5_PredictBasePipeline"}\n')
    return models


def record(checkout: str | os.PathLike, name: str) -> dict:
    """What a fake script recorded (argv, cwd, env, python), or {} when it did not run."""
    p = Path(checkout) / RECORDS / f"{name}.json"
    return json.loads(p.read_text()) if p.is_file() else {}
