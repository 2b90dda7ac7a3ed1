"""Every parameter of ``python -m tutorial_utils serve`` in one typed dataclass (:class:`ServeConfig`).

The server's CLI options and ``--list-params`` are generated from it (:func:`tutorial_utils.params.parse_cli`),
and a process that starts a server builds its command line from an instance
(:func:`server_argv`), so an option cannot be spelled two ways."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from tutorial_utils.errors import ConfigError
from tutorial_utils.params import param, to_argv
from tutorial_utils.serve.protocol import DEFAULT_HOST, DEFAULT_MAX_FRAME_BYTES, DEFAULT_PORT, OPENPI_REPLAN_STEPS

MIB = 2**20


@dataclass
class ServeConfig:
    """The policy server: which policy, where it listens, how it answers."""

    policy: str = param("expert", "policy to serve (registry name: expert, zero, mini, mlp, ...)", "server")
    checkpoint: str | None = param(
        None,
        "checkpoint directory of a trained policy (e.g. runs/<id>/checkpoints/last; None: no checkpoint)",
        "server",
    )
    host: str = param(DEFAULT_HOST, "bind address (127.0.0.1; 0.0.0.0 exposes it to the network)", "server")
    port: int = param(DEFAULT_PORT, "port (0: the system picks a free one)", "server")
    infer_in_thread: bool = param(
        False,
        "kept for older command lines: the server always decodes and infers in a worker thread, so one client's "
        "requests never block another's",
        "server",
    )
    max_frame_mb: float = param(
        DEFAULT_MAX_FRAME_BYTES / MIB,
        "largest request frame in MiB (an openpi LIBERO request, two 224x224 images + state + prompt, is ~0.3 MB); "
        "a bigger frame closes its connection with code 1009",
        "server",
    )
    debug: bool = param(
        False,
        "send the full traceback in error replies (off: only 'ErrorType: message'; the log has it anyway)",
        "server",
    )

    threads: int | None = param(
        None,
        "torch CPU threads of the server process (None: OMP_NUM_THREADS when set, else half the cores), so "
        "inference keeps its latency while a training or the simulator shares the machine",
        "server",
    )
    min_chunk: int = param(
        OPENPI_REPLAN_STEPS,
        "openpi replies hold at least this many actions (openpi's LIBERO loop asserts a chunk of at least its "
        "replan_steps); a shorter chunk is padded by repeating its last action, as the metadata says. 0: send the "
        "policy's own chunk",
        "server",
    )

    temporal_ensemble_coeff: float | None = param(
        None,
        "ACT's temporal ensembling (LeRobot's temporal_ensemble_coeff; the ACT paper: 0.01): predict a chunk at "
        "every step and execute the weighted average of every chunk's prediction for this step (the oldest "
        "prediction weighs 1, each newer one exp(-coeff) times the one before; policies/ensemble.py). Trained "
        "families only; None: execute the chunk",
        "server",
    )

    def check(self) -> None:
        if self.temporal_ensemble_coeff is not None and not math.isfinite(self.temporal_ensemble_coeff):
            raise ConfigError(
                f"temporal_ensemble_coeff={self.temporal_ensemble_coeff!r}: expected a finite number (0.01)"
            )
        if self.threads is not None and self.threads < 0:
            raise ConfigError(f"threads={self.threads}: expected None (half the cores) or a positive number")
        if self.min_chunk < 0:
            raise ConfigError(f"min_chunk={self.min_chunk}: expected a number of actions >= 0")
        mb = self.max_frame_mb
        if not mb > 0 or mb * MIB < 1 or mb == float("inf"):
            raise ConfigError(f"max_frame_mb={mb!r}: expected a positive, finite number of MiB (for example 16)")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port={self.port}: expected 0 (a free one) to 65535")

    @property
    def max_frame_bytes(self) -> int:
        return int(self.max_frame_mb * MIB)


def server_argv(cfg: ServeConfig, python: str | None = None) -> list[str]:
    """The command that starts a server with ``cfg``: ``python -m tutorial_utils serve --policy ...``
    (only the options that differ from their defaults)."""
    return [python or sys.executable, "-m", "tutorial_utils", "serve", *to_argv(cfg)]
