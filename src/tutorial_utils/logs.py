"""The log lines the book, the checks and the diagnosis depend on, in one place.

Formats follow DiT4DiT's training script and LIBERO client and openpi's server (FACTS.md
sections 1, 4, 5), so one parser reads both the ``mini`` and the ``dit4dit`` backend.
Writers (``train``, ``evaluate``, ``serving``) format with these constants; parsers match them.
"""

from __future__ import annotations

# --- training (DiT4DiT/training/train.py) ---------------------------------------------------
TRAIN_TOTAL_PARAMS = "Total parameters: {n:,} ({m:.3f}M)"
TRAIN_TRAINABLE_PARAMS = "Trainable parameters: {n:,} ({m:.3f}M)"
TRAIN_FROZEN_PARAMS = "Frozen parameters: {n:,} ({m:.3f}M)"
TRAIN_RATIO = "Trainable ratio: {pct:.2f}%"
TRAIN_TOTAL_STEPS = "  Total optimization steps = {n}"
TRAIN_PER_DEVICE_BATCH = "  Per device batch size = {n}"
TRAIN_DATALOADER_LEN = "  len(vla_train_dataloader) = {n}"
TRAIN_STEP_LOSS = "[Exp: {run_id}] Step {step}, Loss: {losses}"
TRAIN_COMPLETE = "Training complete. Final model saved at {path}"

# --- policy server (DiT4DiT server_policy.py / websockets / openpi) --------------------------
SERVER_RUNNING = "server running on {host}:{port}"
SERVER_LISTENING = "server listening on {host}:{port}"
SERVER_CONNECTION_OPEN = "connection open"
SERVER_CONNECTION_FROM = "Connection from {addr} opened"
SERVER_CONNECTION_CLOSED = "Connection from {addr} closed"
SERVER_REQUEST_ERROR = "request from {addr} failed: {error}"
SERVER_STOPPED = "server stopped after {requests} requests ({errors} errors)"

# --- LIBERO client (eval_libero.py / openpi examples/libero/main.py) ------------------------
EVAL_TASK = "Task: {task}"
EVAL_STARTING_EPISODE = "Starting episode {n}..."
EVAL_SUCCESS = "Success: {success}"
EVAL_EPISODES_SO_FAR = "# episodes completed so far: {n}"
EVAL_SUCCESSES = "# successes: {n} ({pct:.1f}%)"
EVAL_TASK_RATE = "Current task success rate: {rate}"
EVAL_TOTAL_RATE_SO_FAR = "Current total success rate: {rate}"
EVAL_TOTAL_RATE = "Total success rate: {rate}"
EVAL_TOTAL_EPISODES = "Total episodes: {n}"
EVAL_EGL_HARMLESS = "EGL_NOT_INITIALIZED"


def main(argv: list[str]) -> int:  # replaced by the parsers' CLI when the evaluation stage lands
    print("tutorial_utils.logs: the log parsers and `diagnose` arrive with the evaluation stage.")
    return 2
