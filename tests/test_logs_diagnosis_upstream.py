"""The diagnosis reads upstream DiT4DiT's real logs (issue 13, item 5; docs/FACTS.md section 11).

The logs come from ``upstream_logs``: records rendered by a real ``rich.logging.RichHandler``
configured like upstream's (80 columns, so messages wrap; 200 columns), or plain logging, with
``print`` lines, tqdm redraws and uncaught tracebacks between them as a captured log has them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import upstream_logs as U
from tutorial_utils import logs as L

REPO = Path(__file__).resolve().parents[1]
DET = {d.name: d for d in L.DETECTORS}
TRAIN_FRAME = ("DiT4DiT/training/train.py", 600, "main", "vla = build_framework(cfg)")
DATA_FRAME = (
    "DiT4DiT/dataloader/lerobot_datasets.py",
    64,
    "get_vla_dataset",
    "mixture_spec = DATASET_NAMED_MIXTURES[data_mix]",
)


def _write(tmp_path: Path, **logs: str) -> Path:
    for name, text in logs.items():
        (tmp_path / name.replace("__", ".")).write_text(text, encoding="utf-8")
    return tmp_path


def _err(error: str, *frames):
    return lambda log: log.error(error, frames or (TRAIN_FRAME,))


def _train(**kw):
    return lambda v: {"train__log": U.train_log(U.make(v), **kw)}


def _serve(fail=None, preamble=None, client=None, **kw):
    """server.log (import-time records through the handler, then plain logging) + the client's log."""

    def build(v):
        out = {"server__log": U.server_log(U.make(v), fail=fail, preamble=preamble, **kw)}
        if client is not None:
            out["eval_libero_spatial__log"] = client(U.make(v))
        return out

    return build


def _client(fail=None, connected=False, **kw):
    return lambda log: U.eval_log(log, fail=fail, connected=connected, **kw)


def _download(*lines: str):
    def build(v):
        log = U.make(v)
        for ln in lines:
            if v == "plain":
                log.print(ln)
            else:
                log.log(ln, "ERROR", "download.py:120")  # the same text through the Rich handler
        return {"download__log": log.text()}

    return build


IMPORT_WARNING = lambda log: log.log(  # noqa: E731
    "[*] Failed to auto-import framework submodules: No module named 'pytorch3d'",
    "WARNING",
    "__init__.py:20",
    "DiT4DiT.model.framework",
)
CLIENT_PY38 = ("examples/LIBERO/eval_files/eval_libero.py", 19, "<module>", "from examples.LIBERO.eval_files import x")

#: (case id, detector, log builder per variant, expected failed stage)
CASES = [
    (
        "no_dit4dit_module",
        "no_dit4dit_module",
        _train(fail_in="config", before_start=True, error=_err("ModuleNotFoundError: No module named 'DiT4DiT'")),
        "config",
    ),
    (
        "no_dit4dit_module-server",
        "no_dit4dit_module",
        _serve(
            fail=_err("ModuleNotFoundError: No module named 'DiT4DiT'"),
            client=_client(fail=_err("TimeoutError: Failed to connect to server within 300 seconds")),
        ),
        "server",
    ),
    (
        "not_checkout_root",
        "not_checkout_root",
        _train(
            fail_in="config",
            before_start=True,
            error=_err(
                "ValueError: Expected a string path to an existing deepspeed config, or a dictionary, or a base64 "
                "encoded string. Received: DiT4DiT/config/deepseeds/ds_config.yaml"
            ),
        ),
        "config",
    ),
    (
        "config_yaml_placeholder",
        "config_yaml_placeholder",
        _train(fail_in="config", error=_err("FileNotFoundError: [Errno 2] No such file or directory: 'xxx.yaml'")),
        "config",
    ),
    (
        "mixture_unknown",
        "mixture_unknown",
        _train(
            fail_in="data loader", mix="libero_spatial_only", error=_err("KeyError: 'libero_spatial_only'", DATA_FRAME)
        ),
        "data loader",
    ),
    (
        "dataset_root_placeholder",
        "dataset_root_placeholder",
        _train(
            fail_in="data loader",
            error=_err(f"FileNotFoundError: Dataset path /path/to/dataset/libero/{U.DATASET} does not exist"),
        ),
        "data loader",
    ),
    (
        "dataset_path_missing",
        "dataset_path_missing",
        _train(
            fail_in="data loader",
            error=_err(f"FileNotFoundError: Dataset path /data/datasets/{U.DATASET} does not exist"),
        ),
        "data loader",
    ),
    (
        "modality_json_missing",
        "modality_json_missing",
        _train(
            fail_in="data loader",
            error=_err(f"AssertionError: Please provide a meta/modality.json file in /data/datasets/{U.DATASET}"),
        ),
        "data loader",
    ),
    (
        "cosmos_placeholder",
        "cosmos_placeholder",
        _train(
            fail_in="framework build",
            error=_err(
                "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
                "'namespace/repo_name': '/path/to/Cosmos-Predict2.5-2B'. Use `repo_type` argument if needed."
            ),
        ),
        "framework build",
    ),
    (
        "cosmos_placeholder-server",
        "cosmos_placeholder",
        _serve(
            fail=_err(
                "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
                "'namespace/repo_name': '/path/to/Cosmos-Predict2.5-2B'. Use `repo_type` argument if needed."
            )
        ),
        "server",
    ),
    (
        "cosmos_no_model_index",
        "cosmos_no_model_index",
        _train(
            fail_in="framework build",
            error=_err(
                "OSError: Error no file named model_index.json found in directory /models/Cosmos-Predict2.5-2B."
            ),
        ),
        "framework build",
    ),
    (
        "framework_import_hidden",
        "framework_import_hidden",
        _train(
            preamble=IMPORT_WARNING,
            fail_in="framework build",
            before_start=True,
            error=_err(
                "NotImplementedError: Framework DiT4DiT is not implemented. Plz, python yourframework_py to "
                "specify framework module."
            ),
        ),
        "framework build",
    ),
    (
        "framework_import_hidden-server",
        "framework_import_hidden",
        _serve(
            preamble=IMPORT_WARNING,
            fail=_err(
                "NotImplementedError: Framework DiT4DiT is not implemented. Plz, python yourframework_py to specify"
            ),
        ),
        "server",
    ),
    (
        "no_process_group",
        "no_process_group",
        _train(
            fail_in="data loader",
            error=_err(
                "ValueError: Default process group has not been initialized, please make sure to call "
                "init_process_group."
            ),
        ),
        "data loader",
    ),
    (
        "pretrained_checkpoint_missing",
        "pretrained_checkpoint_missing",
        _train(
            fail_in="pretrained load",
            error=_err(f"RuntimeError: ❌ loading checkpoint failed: [Errno 2] No such file or directory: '{U.CKPT}'"),
        ),
        "pretrained load",
    ),
    (
        "pretrained_checkpoint_missing-server",
        "pretrained_checkpoint_missing",
        _serve(fail=_err(f"FileNotFoundError: Pretrained checkpoint `{U.CKPT}` does not exist.")),
        "server",
    ),
    (
        "config_yaml_missing",
        "config_yaml_missing",
        _serve(fail=_err(f"AssertionError: Missing `config.yaml` for `run_dir = PosixPath('{U.RUN_DIR}')`")),
        "server",
    ),
    (
        "config_yaml_missing-client",
        "config_yaml_missing",
        _serve(
            connections=0,
            client=_client(
                fail=_err(f"AssertionError: Missing `config.yaml` for `run_dir = PosixPath('{U.RUN_DIR}')`")
            ),
        ),
        "client connect",
    ),
    (
        "dataset_statistics_missing",
        "dataset_statistics_missing",
        _serve(
            fail=_err(f"AssertionError: Missing `dataset_statistics.json` for `run_dir = PosixPath('{U.RUN_DIR}')`")
        ),
        "server",
    ),
    (
        "wandb_no_account",
        "wandb_no_account",
        _train(
            fail_in="wandb init",
            before_start=True,
            error=lambda log: (
                log.print("wandb: ERROR api_key not configured (no-tty). call wandb.login(key=[your_api_key])"),
                log.error(
                    "wandb.errors.errors.UsageError: api_key not configured (no-tty). call "
                    "wandb.login(key=[your_api_key])"
                ),
            ),
        ),
        "wandb init",
    ),
    ("server_idle_timeout", "server_idle_timeout", _serve(connections=0, idle=True), "client connect"),
    (
        "client_connect_timeout",
        "client_connect_timeout",
        _serve(
            connections=0, client=_client(fail=_err("TimeoutError: Failed to connect to server within 300 seconds"))
        ),
        "client connect",
    ),
    (
        "inference_server_error",
        "inference_server_error",
        _serve(
            client=_client(
                connected=True,
                fail=_err(
                    "RuntimeError: Error in inference server:\nTraceback (most recent call last):\n"
                    '  File "deployment/model_server/tools/websocket_policy_server.py", line 70, in _handler\n'
                    "KeyError: 'examples'"
                ),
            )
        ),
        "evaluation",
    ),
    (
        "py38_union_annotation",
        "py38_union_annotation",
        _serve(
            connections=0,
            client=lambda log: (
                log.error("TypeError: unsupported operand type(s) for |: 'type' and 'type'", (CLIENT_PY38,)),
                log.text(),
            )[1],
        ),
        "client connect",
    ),
    (
        "py38_subscript_annotation",
        "py38_subscript_annotation",
        _serve(
            connections=0,
            client=lambda log: (log.error("TypeError: 'type' object is not subscriptable", (CLIENT_PY38,)), log.text())[
                1
            ],
        ),
        "client connect",
    ),
    (
        "websockets_ping_interval",
        "websockets_ping_interval",
        _serve(
            connections=0,
            client=_client(
                fail=_err("TypeError: create_connection() got an unexpected keyword argument 'ping_interval'")
            ),
        ),
        "client connect",
    ),
    (
        "hub_gated-1.x",
        "hub_gated",
        _download("Error: Access denied. Model 'nvidia/Cosmos-Predict2.5-2B' requires approval."),
        "download",
    ),
    (
        "hub_gated-0.x",
        "hub_gated",
        _download(
            "huggingface_hub.errors.GatedRepoError: 403 Client Error. (Request ID: Root=1-6750-abc)",
            "Cannot access gated repo for url https://huggingface.co/nvidia/Cosmos-Predict2.5-2B/resolve/"
            "diffusers%2Fbase%2Fpost-trained/model_index.json.",
            "Access to model nvidia/Cosmos-Predict2.5-2B is restricted and you are not in the authorized list. "
            "Visit https://huggingface.co/nvidia/Cosmos-Predict2.5-2B to ask for access.",
        ),
        "download",
    ),
    (
        "hub_unauthorized-1.x",
        "hub_unauthorized",
        _download(
            "huggingface_hub.errors.HfHubHTTPError: 401 Client Error: Unauthorized for url: "
            "https://huggingface.co/api/models/mondo-robotics/dit4dit-model/revision/main (Request ID: Root=1-x)",
            "Invalid credentials in Authorization header",
        ),
        "download",
    ),
    (
        "hub_unauthorized-0.x",
        "hub_unauthorized",
        _download(
            "requests.exceptions.HTTPError: 401 Client Error: Unauthorized for url: "
            "https://huggingface.co/api/models/nvidia/Cosmos-Predict2.5-2B/revision/diffusers%2Fbase%2Fpost-trained"
        ),
        "download",
    ),
    (
        "hub_repo_not_found-1.x",
        "hub_repo_not_found",
        _download(
            "Error: Dataset 'IPEC-COMMUNITY/libero_spatial_lerobot' not found.",
            "If the repo is private, make sure you are authenticated and your token has the required permissions.",
        ),
        "download",
    ),
    (
        "hub_repo_not_found-0.x",
        "hub_repo_not_found",
        _download(
            "huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. (Request ID: Root=1-y)",
            "Repository Not Found for url: https://huggingface.co/api/datasets/IPEC-COMMUNITY/libero_spatial_lerobot/"
            "revision/main.",
        ),
        "download",
    ),
    (
        "hub_revision_not_found-1.x",
        "hub_revision_not_found",
        _download("Error: Revision not found in model 'nvidia/Cosmos-Predict2.5-2B'."),
        "download",
    ),
    (
        "hub_revision_not_found-0.x",
        "hub_revision_not_found",
        _download(
            "huggingface_hub.errors.RevisionNotFoundError: 404 Client Error. (Request ID: Root=1-z)",
            "Revision Not Found for url: https://huggingface.co/api/models/nvidia/Cosmos-Predict2.5-2B/revision/"
            "diffusers%2Fbase%2Fpost-trainedx.",
            "Invalid rev id: diffusers/base/post-trainedx",
        ),
        "download",
    ),
    ("hub_timeout-1.x", "hub_timeout", _download("httpx.ReadTimeout: The read operation timed out"), "download"),
    (
        "hub_timeout-0.x",
        "hub_timeout",
        _download(
            "requests.exceptions.ReadTimeout: (ReadTimeoutError(\"HTTPSConnectionPool(host='huggingface.co', "
            "port=443): Read timed out. (read timeout=10)\"), '(Request ID: 1-w)')"
        ),
        "download",
    ),
    ("disk_full-download", "disk_full", _download("OSError: [Errno 28] No space left on device"), "download"),
    (
        "disk_full-final-save",
        "disk_full",
        _train(
            fail_in="final save",
            error=_err(
                "RuntimeError: [enforce fail at inline_container.cc:626] . PytorchStreamWriter failed writing "
                "file data/412: file write failed"
            ),
        ),
        "final save",
    ),
    (
        "cuda_out_of_memory",
        "cuda_out_of_memory",
        _train(
            fail_in="loss lines",
            error=_err(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                "capacity of 79.25 GiB of which 1.06 GiB is free."
            ),
        ),
        "loss lines",
    ),
]


@pytest.mark.parametrize("variant", U.VARIANTS)
@pytest.mark.parametrize("case,detector,build,stage", CASES, ids=[c[0] for c in CASES])
def test_detector_names_stage_and_fix(tmp_path, case, detector, build, stage, variant):
    logs = build(variant)
    if variant == "rich80-logged":  # the error text itself went through Rich too (and wrapped)
        assert all(re.search(r"ERROR +\| >> ", t) for t in logs.values() if "Traceback" in t)
    d = L.diagnose(_write(tmp_path, **logs))
    names = [f["name"] for f in d.detectors]
    assert not d.ok and d.failed_stage == stage, (d.failed_stage, names, str(d))
    assert names and names[0] == detector, names
    hit = d.detectors[0]
    assert hit["fix"] == DET[detector].fix and hit["cause"] == DET[detector].cause
    assert DET[detector].fix in str(d)  # what `logs diagnose` prints


def test_every_detector_has_a_case_and_matches_its_own_message():
    assert {c[1] for c in CASES} == set(DET)
    for det in L.DETECTORS:
        assert det.stages is not None and det.fix and det.cause and det.facts.startswith("FACTS")
        for kind, stage in det.stages:
            assert kind in ("train", "server", "eval", "download") and stage


def test_a_detector_that_names_an_earlier_stage_does_not_move_the_failure_back(tmp_path):
    """The import warning names 'framework build', but this run got to its final save."""
    text = U.train_log(
        U.RichLog(80),
        preamble=IMPORT_WARNING,
        fail_in="final save",
        error=_err("OSError: [Errno 28] No space left on device"),
    )
    d = L.diagnose(_write(tmp_path, train__log=text))
    assert d.failed_stage == "final save"
    assert [f["name"] for f in d.detectors] == ["framework_import_hidden", "disk_full"]


# --- the stage order of train.py main() ---------------------------------------------------------------


@pytest.mark.parametrize("variant", ("plain", "rich80", "rich200"))
@pytest.mark.parametrize("stage", U.TRAIN_STAGES)
def test_upstream_train_stage_that_failed(tmp_path, stage, variant):
    text = U.train_log(U.make(variant), fail_in=stage, error=_err("RuntimeError: something went wrong"))
    d = L.diagnose(_write(tmp_path, train__log=text))
    assert d.kind == "training" and d.failed_stage == stage
    assert d.causes[0] == "error in the log: RuntimeError: something went wrong"
    assert d.causes[1:] == list(L.UPSTREAM_TRAIN_CAUSES[stage])
    i = [s for s, _ in L.UPSTREAM_TRAIN_STAGES].index(stage)
    assert all(d.signs[s] for s in L.UPSTREAM_TRAIN_SIGNS[:i]) and not d.signs[L.UPSTREAM_TRAIN_SIGNS[i]]


@pytest.mark.parametrize("variant", ("plain", "rich80", "rich200"))
def test_upstream_train_success_path(tmp_path, variant):
    text = U.train_log(U.make(variant))
    d = L.diagnose(_write(tmp_path, train__log=text))
    assert d.ok and d.detectors == [], str(d)
    assert list(d.signs) == [*L.UPSTREAM_TRAIN_SIGNS, L.SMOKE_SIGN] and all(d.signs.values())  # a 2-step log
    assert d.figures["run_id"] == U.RUN_ID and d.figures["final_model"] == f"{U.RUN_DIR}/final_model"
    tr = L.parse_train_log(text)
    assert (tr["total_params"], tr["trainable_params"], tr["frozen_params"]) == (2156235080, 163073544, 1993161536)
    assert tr["trainable_ratio"] == 7.56 and tr["total_steps"] == 2 and tr["dataloader_len"] == 52970
    assert [s["step"] for s in tr["steps"]] == [1, 2]
    assert tr["steps"][0]["losses"] == U._loss(1)  # every key, learning_rate/<group> too; the stray ")" is gone
    assert tr["steps"][1]["losses"]["total_loss"] == 0.2625


def test_two_step_run_without_logging_frequency_1_has_no_loss_line(tmp_path):
    text = U.train_log(U.RichLog(80), logging_frequency=10)
    d = L.diagnose(_write(tmp_path, train__log=text))
    assert d.failed_stage == "loss lines" and d.signs["training complete"] and not d.signs["first loss line"]
    assert any("--trainer.logging_frequency 1" in c for c in d.causes)


def test_upstream_evaluation_success_path(tmp_path):
    d = L.diagnose(
        _write(
            tmp_path,
            server__log=U.server_log(U.RichLog(80), preamble=IMPORT_WARNING),
            eval_libero_spatial__log=U.eval_log(U.RichLog(80)),
        )
    )
    assert d.ok, str(d)
    assert d.figures["episodes"] == 2 and d.figures["successes"] == 1 and d.figures["total_success_rate"] == 0.5
    ev = L.parse_eval_log(tmp_path / "eval_libero_spatial.log")
    assert [t["task"] for t in ev["tasks"]] == [U.TASK]  # the Task: line starts with a newline upstream
    assert [n for n in d.notes if "framework_import_hidden" in n]  # reported, not blamed


# --- the normaliser -----------------------------------------------------------------------------------


def _collapsed(text: str) -> list[str]:
    return [" ".join(ln.split()) for ln in L.normalise(text).splitlines()]


@pytest.mark.parametrize("width", (80, 200))
@pytest.mark.parametrize("maker", (U.train_log, U.server_log, U.eval_log))
def test_rich_and_plain_give_the_same_message_lines(maker, width):
    kw = {"preamble": IMPORT_WARNING} if maker is U.server_log else {}
    rich = maker(U.RichLog(width), **kw)
    assert "| >> " in rich and "INFO:__main__" not in rich
    assert _collapsed(rich) == _collapsed(maker(U.PlainLog(), **kw))
    assert L.normalise(L.normalise(rich)) == L.normalise(rich)


def test_normalise_joins_rich_wrapping_exactly():
    log = U.RichLog(80)
    long_path = "/very/long/path/to/the/runs/directory/of/a/run/with/a/long/name/dit4dit_smoke/final_model"
    log.log(f"Training complete. Final model saved at {long_path}", where="train.py:565")
    log.log("📊 Model Parameter Statistics (after freezing): a message with emoji that wraps", where="train.py:206")
    log.log('Arguments: {\n    "host": "127.0.0.1"\n}', where="eval_libero.py:59")
    log.log("=" * 80, where="train.py:205")
    text = log.text()
    assert max(len(ln) for ln in text.splitlines()) == 80 and len(text.splitlines()) > 10
    assert L.normalise(text).splitlines() == [
        f"Training complete. Final model saved at {long_path}",
        "📊 Model Parameter Statistics (after freezing): a message with emoji that wraps",
        "Arguments: {",
        '    "host": "127.0.0.1"',
        "}",
        "=" * 80,
    ]


def test_normalise_reads_a_rich_traceback_box():
    log = U.RichLog(80)
    log.exception("building the data loader failed", KeyError("libero_spatial_only"), where="train.py:104")
    text = log.text()
    assert "╭" in text and "Traceback (most recent call last)" in text
    lines = L.normalise(text).splitlines()
    assert lines[:2] == ["building the data loader failed", "Traceback (most recent call last):"]
    assert lines[-1] == "KeyError: 'libero_spatial_only'"
    assert L.parse_train_log(text)["errors"] == ["KeyError: 'libero_spatial_only'"]


def test_normalise_leaves_our_own_logs_alone():
    from helpers import SERVER_OK, TRAIN_OK, eval_log

    for text in (SERVER_OK, TRAIN_OK, eval_log(egl=True)):
        assert L.normalise(text) == text
    for p in sorted((REPO / "logs").glob("*.log")):
        text = p.read_text(encoding="utf-8")
        assert L.normalise(text) == text.replace("\r\n", "\n"), p.name


def test_normalise_strips_colour_codes_and_progress_redraws():
    text = "\r  0%|          | 0/2 [00:00<?, ?it/s]\r 50%|█████     | 1/2 [00:05<00:05]\x1b[2m12/03\x1b[0m done\n"
    assert L.normalise(text) == "12/03 done\n"
    assert L.normalise("INFO:root:server running ...\n") == "server running ...\n"


# --- the CLI and the book page --------------------------------------------------------------------------


def test_cli_prints_the_detector_and_its_fix(tmp_path):
    _write(
        tmp_path, **_serve(fail=_err(f"AssertionError: Missing `config.yaml` for `run_dir = '{U.RUN_DIR}'`"))("rich80")
    )
    out = subprocess.run(
        [sys.executable, "-m", "tutorial_utils", "logs", "diagnose", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "FAILED at stage 'server'" in out.stdout
    assert f"config_yaml_missing: {DET['config_yaml_missing'].fix}" in out.stdout


def test_troubleshooting_page_has_one_entry_per_detector():
    page = (REPO / "book" / "troubleshooting.md").read_text(encoding="utf-8")
    tags = {m.group(1): m.start() for m in re.finditer(r"Detector:\s+`([a-z0-9_]+)`", page)}
    assert len(tags) == len(re.findall(r"Detector:\s+`", page))  # one entry per detector
    assert sorted(tags) == sorted(DET), set(tags) ^ set(DET)
    for det in L.DETECTORS:  # each entry shows the upstream message the detector matches
        block = page[: tags[det.name]].rsplit("\n\n", 1)[-1]
        assert det.message in block, det.name
        if det.requires is None:  # (mixture_unknown also needs the mixture line: tested with the logs)
            assert det.search(det.message.replace("`<path>`", "`/x.pt`")), det.name
