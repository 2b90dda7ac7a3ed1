"""Log text as upstream DiT4DiT's processes write it, for the diagnosis tests (no upstream code).

Upstream (commit 0362b34, ``DiT4DiT/training/trainer_utils/overwatch.py``) configures the root
logger with a ``rich.logging.RichHandler``: message format ``| >> %(message)s``, date format
``%m/%d [%H:%M:%S]``, markup and Rich tracebacks on, time, level and path columns shown; a log
file gets 80 columns (``COLUMNS=200`` gives 200). ``RichLog`` renders records through a REAL
``RichHandler`` configured that way on a ``rich.console.Console`` of the chosen width, so the tests
see Rich's exact output (blank repeated times, wrapping, folding, tracebacks in a box).
``PlainLog`` writes what ``logging.basicConfig`` writes (``INFO:root:...``): ``server_policy.py``
resets the root logger to it after its imports. ``print`` output, tqdm bars and uncaught
tracebacks reach a captured log unformatted in both.

The scripts' lines follow docs/FACTS.md section 11 (train.py's stage order, the server's and the
client's lines); the error texts are the upstream and library strings each detector names.
"""

from __future__ import annotations

import io
import logging

RUN_DIR = "/runs/dit4dit_smoke"
RUN_ID = "dit4dit_smoke"
MIX = "libero_spatial_smoke"
DATASET = "libero_spatial_no_noops_1.0.0_lerobot"
CKPT = "/models/dit4dit-model/dit4dit_libero/final_model/pytorch_model.pt"
TASK = "pick up the black bowl between the plate and the ramekin and place it on the plate"


class PlainLog:
    """A captured log of a process whose root logger is plain ``logging.basicConfig``."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def log(self, msg: str, level: str = "INFO", where: str = "train.py:1", name: str = "__main__") -> None:
        """A record through the process's handler (here: ``LEVEL:name:message``)."""
        self.plain(msg, level, name)

    def plain(self, msg: str, level: str = "INFO", name: str = "root") -> None:
        """A record through plain ``logging.basicConfig`` (server_policy.py after its imports)."""
        self.parts.append(f"{level}:{name}:{msg}\n")

    def print(self, *lines: str) -> None:
        self.parts.append("".join(ln + "\n" for ln in lines))

    def bar(self, n: int, total: int, desc: str = "", postfix: str = "") -> None:
        """One tqdm redraw (``\\r`` and no newline, as tqdm writes it to a file)."""
        pct = int(100 * n / total)
        filled = "█" * (10 * n // total)
        head = f"{desc}: " if desc else ""
        self.parts.append(f"\r{head}{pct:3d}%|{filled:<10}| {n}/{total} [00:0{n}<00:0{total - n}, 5.02s/it{postfix}]")

    def newline(self) -> None:
        self.parts.append("\n")

    def traceback(self, error: str, frames: tuple[tuple[str, int, str, str], ...] = ()) -> None:
        """An uncaught exception as Python prints it (tracebacks bypass the logging handlers)."""
        body = "".join(f'  File "{f}", line {n}, in {fn}\n    {code}\n' for f, n, fn, code in frames)
        self.parts.append(f"Traceback (most recent call last):\n{body}{error}\n")

    def error(self, error: str, frames: tuple[tuple[str, int, str, str], ...] = ()) -> None:
        """An error the way upstream surfaces it: an uncaught traceback."""
        self.traceback(error, frames)

    def text(self) -> str:
        return "".join(self.parts)


class RichLog(PlainLog):
    """A captured log of a process whose root logger has upstream's Rich handler."""

    def __init__(self, width: int = 80, log_errors: bool = False) -> None:
        from rich.console import Console
        from rich.logging import RichHandler

        super().__init__()
        self.log_errors = log_errors
        self._buf = io.StringIO()
        console = Console(file=self._buf, width=width, color_system=None, force_terminal=False)
        self.handler = RichHandler(
            console=console, markup=True, rich_tracebacks=True, show_time=True, show_level=True, show_path=True
        )
        self.handler.setFormatter(logging.Formatter("| >> %(message)s", datefmt="%m/%d [%H:%M:%S]"))
        self.clock = 1_796_292_000.0  # a fixed time: the rendering does not depend on when tests run

    def log(self, msg: str, level: str = "INFO", where: str = "train.py:1", name: str = "__main__") -> None:
        self.record(msg, level, where, name)

    def record(self, msg: str, level: str, where: str, name: str, exc_info=None) -> None:
        path, line = where.rsplit(":", 1)
        rec = logging.LogRecord(name, getattr(logging, level), path, int(line), msg, None, exc_info)
        rec.created = self.clock
        self.clock += 0.6  # some records share a second (Rich leaves the time blank), some do not
        self.handler.handle(rec)
        self.parts.append(self._buf.getvalue())
        self._buf.seek(0)
        self._buf.truncate()

    def error(self, error: str, frames: tuple[tuple[str, int, str, str], ...] = ()) -> None:
        """Uncaught, as upstream; with ``log_errors`` the error text also goes through the handler
        (as ``logger.error`` would), so the detectors are tested on wrapped error text too."""
        self.traceback(error, frames)
        if self.log_errors:
            self.log(error, "ERROR", "train.py:612")

    def exception(self, msg: str, exc: BaseException, where: str = "train.py:1") -> None:
        """``logger.exception``: Rich draws the traceback in a box inside the message column."""
        try:
            raise exc
        except BaseException as caught:  # noqa: BLE001 - rendering the real exception
            self.record(msg, "ERROR", where, "__main__", exc_info=(type(caught), caught, caught.__traceback__))


def make(variant: str) -> PlainLog:
    """``plain``, ``rich80``, ``rich200`` or ``rich80-logged`` (errors also through Rich)."""
    return {
        "plain": PlainLog,
        "rich80": lambda: RichLog(80),
        "rich200": lambda: RichLog(200),
        "rich80-logged": lambda: RichLog(80, log_errors=True),
    }[variant]()


VARIANTS = ("plain", "rich80", "rich80-logged")


# --- upstream train.py --------------------------------------------------------------------------------


def _loss(step: int) -> dict:
    a, v = round(0.5 / step, 6), round(0.25 / step, 6)
    return {
        "action_dit_loss": a,
        "future_video_loss": v,
        "future_video_loss_scaled": round(v * 0.1, 7),
        "total_loss": round(a + v * 0.1, 7),
        "data_time": 1.2345,
        "model_time": 6.789,
        "learning_rate/backbone": 1e-05,
        "learning_rate/action_model": 0.0001,
        "epoch": 0.0,
    }


def _stage_lines(log: PlainLog, steps: int, mix: str, logging_frequency: int) -> dict:
    """Each stage of train.py main() as (start, done) writers, in upstream's order."""
    t = "train.py"

    def config_start():
        log.print(
            "Distributed environment: DistributedType.DEEPSPEED  Backend: nccl",
            "Num processes: 1",
            "Process index: 0",
            "Local process index: 0",
            "Device: cuda:0",
            "",
            "Mixed precision type: bf16",
            "ds_config: {'train_micro_batch_size_per_gpu': 'auto', 'zero_optimization': {'stage': 2}}",
        )

    def config_done():
        log.log("VLA Training :: Warming Up", where=f"{t}:576")
        log.log("✅ Configuration wrapped for access tracking", where=f"{t}:580")

    def build_start():
        for i in range(6):
            log.bar(i, 5, desc="Loading pipeline components...")
        log.newline()
        log.print("Total number of DiT parameters:  151922176")

    def data_start():
        log.log(f"Creating VLA Dataset with Mixture `{mix}`", where=f"{t}:96")
        log.log("Using action_video_freq_ratio=1", where=f"{t}:99")
        log.print(f"Initialized dataset {DATASET} with EmbodimentTag.LIBERO_FRANKA")

    def data_done():
        log.print(
            "Dataset lengths: [52970]",
            f"Merged dataset statistics saved to: {RUN_DIR}/dataset_statistics.json",
            "Used action keys (reordered): ['x', 'y', 'z', 'roll', 'pitch', 'yaw', 'gripper']",
        )

    def optimiser_done():
        log.log("LR Group backbone: lr=1e-05, num_params=612", where=f"{t}:123")
        log.log("LR Group action_model: lr=0.0001, num_params=281", where=f"{t}:123")

    def pretrained_start():
        log.print(f"📦 loading checkpoint: {CKPT}")

    def pretrained_done():
        log.print("✅ loaded <full_model> model parameters")
        log.log(f"Loaded pretrained checkpoint: {CKPT}, steps: 0", where=f"{t}:289")

    def freeze_start():
        log.print("#" * 30, "backbone_interface")

    def totals_start():
        log.log("=" * 80, where=f"{t}:205")
        log.log("📊 Model Parameter Statistics (after freezing):", where=f"{t}:206")

    def totals_done():
        log.log("  Total parameters:      2,156,235,080 (2156.235M)", where=f"{t}:207")
        log.log("  Trainable parameters:  163,073,544 (163.074M)", where=f"{t}:208")
        log.log("  Frozen parameters:     1,993,161,536 (1993.162M)", where=f"{t}:209")
        log.log("  Trainable ratio:       7.56%", where=f"{t}:210")
        log.log("=" * 80, where=f"{t}:211")
        log.print("📊 model parameter statistics:", "# Parameters (in millions): 2156.235 Total, 163.074 Trainable")

    def deepspeed_start():
        log.print(
            "[2026-12-03 10:00:01,000] [INFO] [logging.py:107:log_dist] [Rank 0] DeepSpeed info: "
            "version=0.18.4, git-hash=unknown, git-branch=unknown",
            "[2026-12-03 10:00:02,000] [INFO] [stage_1_and_2.py:150:__init__] Reduce bucket size 500000000",
        )

    def wandb_start():
        log.print("wandb: Tracking run with wandb version 0.21.0")

    def wandb_done():
        log.print(
            "wandb: W&B syncing is set to `offline` in this directory. Run `wandb online` or set "
            "WANDB_MODE=online to enable cloud syncing.",
            f"wandb: Run data is saved locally in {RUN_DIR}/wandb/offline-run-20261203_100003-abc123",
        )

    def steps_start():
        log.log("***** Training Configuration *****", where=f"{t}:467")
        log.log(f"  Total optimization steps = {steps}", where=f"{t}:468")
        log.log("  Per device batch size = 1", where=f"{t}:469")
        log.log("  Gradient accumulation steps = 1", where=f"{t}:470")
        log.log("  Total batch size = 1", where=f"{t}:471")

    def steps_done():
        log.log("  len(vla_train_dataloader) = 52970", where=f"{t}:472")
        log.log("  len(vla_train_dataloader.dataset) = 52970", where=f"{t}:473")

    def loss_start():
        log.bar(0, steps)

    def loss_done():
        for i in range(1, steps + 1):
            log.bar(i, steps, postfix=", data_times=1.234, model_times=6.789")
            if i % logging_frequency == 0:
                log.log(f"[Exp: {RUN_ID}] Step {i}, Loss: {_loss(i)})", where=f"{t}:347")
        log.newline()

    def final_done():
        log.log(f"Training complete. Final model saved at {RUN_DIR}/final_model", where=f"{t}:565")
        log.print("wandb: You can sync this run to the cloud by running:", f"wandb: wandb sync {RUN_DIR}/wandb")
        log.log("... and that's all, folks!", where=f"{t}:609")

    def nothing():
        pass

    return {
        "config": (config_start, config_done),
        "framework build": (build_start, nothing),
        "data loader": (data_start, data_done),
        "optimiser": (nothing, optimiser_done),
        "pretrained load": (pretrained_start, pretrained_done),
        "freeze": (freeze_start, nothing),
        "parameter totals": (totals_start, totals_done),
        "DeepSpeed prepare": (deepspeed_start, nothing),
        "wandb init": (wandb_start, wandb_done),
        "optimisation steps": (steps_start, steps_done),
        "loss lines": (loss_start, loss_done),
        "final save": (nothing, final_done),
    }


TRAIN_STAGES = tuple(_stage_lines(PlainLog(), 2, MIX, 1))


def train_log(
    log: PlainLog,
    *,
    fail_in: str | None = None,
    error=None,
    before_start: bool = False,
    steps: int = 2,
    mix: str = MIX,
    logging_frequency: int = 1,
    preamble=None,
) -> str:
    """Upstream train.py's captured output, complete, or up to the stage ``fail_in``: its start
    lines (unless ``before_start``), then ``error(log)``, then the launcher's own failure lines."""
    if preamble:
        preamble(log)
    for stage, (start, done) in _stage_lines(log, steps, mix, logging_frequency).items():
        if stage == fail_in:
            if not before_start:
                start()
            error(log)
            log.print(
                "E1203 10:00:09.000000 4242 torch/distributed/elastic/multiprocessing/api.py:874] failed "
                "(exitcode: 1) local_rank: 0 (pid: 4243) of binary: /venv/bin/python",
            )
            log.traceback(
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
                (("/venv/bin/accelerate", 8, "<module>", "sys.exit(main())"),),
            )
            return log.text()
        start()
        done()
    return log.text()


# --- upstream server_policy.py and eval_libero.py -----------------------------------------------------


def server_log(log: PlainLog, *, fail=None, preamble=None, connections: int = 1, idle: bool = False) -> str:
    """server_policy.py: import-time records through the package's handler (``preamble``), then
    plain logging (it calls ``basicConfig(force=True)``): checkpoint load, ``server running ...``,
    the websockets lines, connections; ``fail`` replaces everything after the checkpoint line."""
    if preamble:
        preamble(log)
    log.plain(f"[*] Loading from local checkpoint path `{CKPT}`", name="DiT4DiT.model.framework.share_tools")
    if fail:
        fail(log)
        return log.text()
    for i in range(6):
        log.bar(i, 5, desc="Loading pipeline components...")
    log.newline()
    log.plain("Creating server (host: gpu01, ip: 10.0.0.5)")
    log.plain("server running ...")
    log.plain("server listening on 0.0.0.0:5694", name="websockets.server")
    for c in range(connections):
        addr = ("127.0.0.1", 40000 + c)
        log.plain("connection open", name="websockets.server")
        log.plain(f"Connection from {addr} opened")
        log.plain(f"Connection from {addr} closed")
    if idle:
        log.plain("Idle timeout (1800s) reached, shutting down server.")
    return log.text()


def eval_log(log: PlainLog, *, fail=None, connected: bool = True, episodes: int = 2, finish: bool = True) -> str:
    """eval_libero.py (its root logger has the package's Rich handler): arguments, the wait for
    the server, then per task the ``Task:`` line that starts with a newline, episodes and rates."""
    e = "eval_libero.py"
    log.log('Arguments: {\n    "host": "127.0.0.1",\n    "port": 5694\n}', where=f"{e}:59")
    log.log("Task suite: libero_spatial", where=f"{e}:68")
    log.log("Waiting for server at ws://127.0.0.1:5694...", where="websocket_policy_client.py:30")
    if not connected:
        log.log("Still waiting for server ws://127.0.0.1:5694 ...", where="websocket_policy_client.py:54")
        if fail:
            fail(log)
        return log.text()
    log.log(f"\nTask: {TASK}", where=f"{e}:110")
    ok = 0
    for n in range(1, episodes + 1):
        log.log(f"Starting episode {n}...", where=f"{e}:124")
        if fail and n == episodes:
            fail(log)
            return log.text()
        ok += n % 2
        log.log(f"Success: {bool(n % 2)}", where=f"{e}:234")
        log.log(f"# episodes completed so far: {n}", where=f"{e}:235")
        log.log(f"# successes: {ok} ({ok / n * 100:.1f}%)", where=f"{e}:236")
    log.log(f"Current task success rate: {ok / episodes}", where=f"{e}:241")
    log.log(f"Current total success rate: {ok / episodes}", where=f"{e}:244")
    if finish:
        log.log(f"Total success rate: {ok / episodes}", where=f"{e}:248")
        log.log(f"Total episodes: {episodes}", where=f"{e}:251")
    return log.text()
