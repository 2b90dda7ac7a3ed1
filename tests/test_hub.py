"""The hub stage against the package's local stand-in for the Hub (``hub.local_server``).

It serves a dataset the project generates as ``dataset:libero_spatial``, a small fake
checkpoint as ``checkpoint`` and a gated ``cosmos`` on a slashed revision; faults (a response
cut short, a stall inside a big file) and a small tmpfs show what a real network and a full
disk do to a download.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import TINY_MINI, fill
from tutorial_utils.errors import DiskFull
from tutorial_utils.hub import download as hub
from tutorial_utils.hub.assets import ASSETS, get_asset
from tutorial_utils.hub.local_server import LocalHub, LocalRepo, serve_repos

GOOD_TOKEN = "hf_test_good_token_0123456789"
NO_ACCESS_TOKEN = "hf_test_no_access_0123456789"


@pytest.fixture(scope="module")
def fake_hub(tmp_path_factory):
    from tutorial_utils.data.synth import generate_dataset

    root = generate_dataset(tmp_path_factory.mktemp("ds") / "d", n_episodes=2, mean_length=8, image_size=32)
    server = LocalHub(tokens=(GOOD_TOKEN, NO_ACCESS_TOKEN), licences=(GOOD_TOKEN,))
    server.start()
    server.add(LocalRepo(ASSETS["dataset:libero_spatial"].repo_id, root, "dataset"))
    ckpt = {
        "dit4dit_libero/final_model/pytorch_model.pt": bytes(range(256)) * 40,
        "dit4dit_libero/config.yaml": b"framework:\n  cosmos25:\n    base_model: /path/to/Cosmos-Predict2.5-2B\n",
        "dit4dit_libero/dataset_statistics.json": b'{"libero_franka": {}}',
        "dit4dit_robocasa/final_model/pytorch_model.pt": b"\0" * 5000,  # must not be fetched
        "README.md": b"# DiT4DiT\n",
    }
    server.add(LocalRepo(ASSETS["checkpoint"].repo_id, ckpt))
    cosmos = {"model_index.json": b'{"_class_name": "Cosmos"}', "transformer/weights.safetensors": b"\1" * 3000}
    server.add(LocalRepo(ASSETS["cosmos"].repo_id, cosmos, revisions=("diffusers/base/post-trained",), gated=True))
    yield server
    server.close()


@pytest.fixture(autouse=True)
def hub_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)


def test_plan_lists_files_and_bytes(fake_hub, tmp_path, capsys):
    from tutorial_utils.hub.cli import main

    p = hub.plan("checkpoint", endpoint=fake_hub.url, dest=tmp_path)
    paths = [f["path"] for f in p["files"]]
    assert paths == sorted(k for k in fake_hub.repo(p["repo_id"]).paths if k.startswith("dit4dit_libero/"))
    assert p["total_bytes"] == sum(f["size"] for f in p["files"]) and p["n_files"] == 3
    assert p["fits"] is True
    assert main(["plan", "dataset:libero_spatial", "--endpoint", fake_hub.url]) == 0
    out = capsys.readouterr().out
    assert "meta/info.json" in out and "bytes" in out and "IPEC-COMMUNITY/libero_spatial" in out


def test_download_verify_manifest_and_dataset_opens(fake_hub, tmp_path):
    from tutorial_utils.data.reader import LeRobotDataset

    dest = tmp_path / "libero_spatial_no_noops_1.0.0_lerobot"
    out = hub.download("dataset:libero_spatial", dest, endpoint=fake_hub.url)
    assert out["verify"]["ok"] and out["verify"]["checksums_checked"] == out["verify"]["n_files"]
    manifest = json.loads((dest / "manifest.json").read_text())
    repo = fake_hub.repo(ASSETS["dataset:libero_spatial"].repo_id, "dataset")
    assert manifest["commit"] == repo.commit and manifest["revision"] == "main"
    assert manifest["files"] == {k: repo.size(k) for k in repo.paths}
    assert manifest["checksum_method"] == "HfApi.verify_repo_checksums"
    assert any(m == "GET" and "/resolve/" in u for m, u in fake_hub.log)
    ds = LeRobotDataset(dest)
    ds.validate(deep=True)
    assert len(ds.episodes) == 2


def test_checkpoint_allow_patterns_and_cli(fake_hub, tmp_path, capsys):
    from tutorial_utils.hub.cli import main

    dest = tmp_path / "dit4dit-model"
    assert main(["download", "checkpoint", "--dest", str(dest), "--endpoint", fake_hub.url]) == 0
    assert (dest / "dit4dit_libero/final_model/pytorch_model.pt").stat().st_size == 10240
    assert not (dest / "dit4dit_robocasa").exists() and not (dest / "README.md").exists()
    assert "verified" in capsys.readouterr().out
    assert main(["verify", "checkpoint", "--dest", str(dest), "--endpoint", fake_hub.url]) == 0


def test_flipped_byte_is_caught_naming_the_file(fake_hub, tmp_path):
    dest = tmp_path / "ckpt"
    hub.download("checkpoint", dest, endpoint=fake_hub.url)
    pt = dest / "dit4dit_libero/final_model/pytorch_model.pt"
    data = bytearray(pt.read_bytes())
    data[100] ^= 0xFF
    pt.write_bytes(bytes(data))
    with pytest.raises(hub.HubVerifyError, match=r"dit4dit_libero/final_model/pytorch_model\.pt: sha256"):
        hub.verify("checkpoint", dest, endpoint=fake_hub.url)
    assert not (dest / "manifest.json").exists()


def test_stale_incomplete_reported_then_removed_once_clean(fake_hub, tmp_path):
    dest = tmp_path / "ckpt"
    hub.download("checkpoint", dest, endpoint=fake_hub.url)
    stale = dest / ".cache/huggingface/download/dit4dit_libero/final_model/abc.def.incomplete"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"partial")
    assert hub.stale_incomplete(dest) == [str(stale.relative_to(dest))]
    v = hub.verify("checkpoint", dest, endpoint=fake_hub.url)
    assert v["stale_incomplete"] == [str(stale.relative_to(dest))] and not stale.exists()
    assert json.loads((dest / "manifest.json").read_text())["stale_incomplete_removed"]


def test_unreachable_hub_is_a_teaching_timeout(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(hub.HubTimeoutError, match="HF_|network"):
        hub.download("checkpoint", tmp_path / "x", endpoint=url, timeout_s=2)


def test_cosmos_slashed_revision_with_token(fake_hub, tmp_path):
    dest = tmp_path / "Cosmos-Predict2.5-2B"
    out = hub.download("cosmos", dest, endpoint=fake_hub.url, token=GOOD_TOKEN)
    assert out["verify"]["ok"] and (dest / "model_index.json").is_file()
    assert json.loads((dest / "manifest.json").read_text())["revision"] == "diffusers/base/post-trained"
    assert GOOD_TOKEN not in (dest / "manifest.json").read_text()
    assert any("diffusers%2Fbase%2Fpost-trained" in u for _, u in fake_hub.log)


def test_gated_403_and_missing_or_wrong_token_401_teach(fake_hub, tmp_path, capsys):
    with pytest.raises(hub.HubGatedError, match="accept the licence"):
        hub.download("cosmos", tmp_path / "a", endpoint=fake_hub.url, token=NO_ACCESS_TOKEN)
    with pytest.raises(hub.HubAuthError, match="no valid token.*HF_TOKEN.*hf auth login"):
        hub.download("cosmos", tmp_path / "b", endpoint=fake_hub.url)
    with pytest.raises(hub.HubAuthError, match="refused"):
        hub.plan("cosmos", endpoint=fake_hub.url, token="hf_wrong")
    captured = capsys.readouterr()
    assert NO_ACCESS_TOKEN not in captured.out + captured.err


def test_repo_and_revision_not_found(fake_hub, tmp_path):
    from dataclasses import replace

    with pytest.raises(hub.HubNotFoundError, match="repository not found") as e:
        hub.plan(get_asset("dataset:libero_goal"), endpoint=fake_hub.url)
    # the fix names only flags and commands that exist
    assert "--repo-type" not in str(e.value) and "`python -m tutorial_utils hub list`" in str(e.value)
    from tutorial_utils.hub.cli import main as hub_main

    assert hub_main(["list"]) == 0
    with pytest.raises(hub.HubNotFoundError, match="revision 'nope' not found"):
        hub.download(replace(get_asset("checkpoint"), revision="nope"), tmp_path / "x", endpoint=fake_hub.url)


# --- the local server itself ------------------------------------------------------------------------


def test_serve_repos_by_asset_name_and_bad_specs(tmp_path):
    from tutorial_utils.errors import ConfigError

    folder = tmp_path / "cosmos"
    (folder / "transformer").mkdir(parents=True)
    (folder / "model_index.json").write_text("{}")
    (folder / "transformer/w.safetensors").write_bytes(b"\2" * 100)
    (folder / ".cache/huggingface").mkdir(parents=True)
    (folder / ".cache/huggingface/x.incomplete").write_bytes(b"never served")
    with serve_repos({"cosmos": folder}, tokens=(GOOD_TOKEN,), licences=(GOOD_TOKEN,)) as url:
        p = hub.plan("cosmos", endpoint=url, token=GOOD_TOKEN)
        assert [f["path"] for f in p["files"]] == ["model_index.json", "transformer/w.safetensors"]
        assert p["files"][1]["sha256"] and p["files"][0]["sha256"] is None  # binaries are LFS files
        with pytest.raises(hub.HubAuthError):
            hub.plan("cosmos", endpoint=url)  # the asset table says gated: so is the stand-in
    with pytest.raises(ConfigError, match="not a folder"):
        LocalRepo("a/b", tmp_path / "nope")
    with pytest.raises(ConfigError, match="model:owner/name"):
        with serve_repos({"weird": folder}):
            pass


# --- faults: a response cut short, a kill mid-file, a full disk ---------------------------------------

BIG = "dit4dit_libero/final_model/pytorch_model.pt"


def _ckpt_files(big_bytes: int) -> dict[str, bytes]:
    return {
        BIG: os.urandom(big_bytes),
        "dit4dit_libero/config.yaml": b"framework: {}\n",
        "dit4dit_libero/dataset_statistics.json": b"{}",
    }


def test_a_response_cut_short_once_is_retried(tmp_path):
    with LocalHub() as server:
        server.add(LocalRepo(ASSETS["checkpoint"].repo_id, _ckpt_files(200_000)))
        server.truncate(BIG, at=1000, times=1)
        out = hub.download("checkpoint", tmp_path / "once", endpoint=server.url, progress=False)
    assert out["verify"]["ok"] and sum(1 for m, u in server.log if m == "GET" and u.endswith(BIG)) == 2


@pytest.mark.slow
def test_responses_always_cut_short_are_a_teaching_error_and_leave_no_short_file(tmp_path):
    with LocalHub() as server:  # huggingface_hub retries with a back-off first (~6 s)
        server.add(LocalRepo(ASSETS["checkpoint"].repo_id, _ckpt_files(200_000)))
        server.truncate(BIG, at=1000, times=-1)
        with pytest.raises(hub.HubTimeoutError, match="cut short.*received 1000 bytes"):
            hub.download("checkpoint", tmp_path / "always", endpoint=server.url, progress=False)
    assert not (tmp_path / "always" / "manifest.json").exists()
    assert not (tmp_path / "always" / BIG).exists()  # no short file passes as a finished one


def test_verify_never_passes_a_short_file(fake_hub, tmp_path):
    dest = tmp_path / "ckpt"
    hub.download("checkpoint", dest, endpoint=fake_hub.url, progress=False)
    pt = dest / BIG
    pt.write_bytes(pt.read_bytes()[:-1])
    with pytest.raises(hub.HubVerifyError, match=r"pytorch_model\.pt: 10239 bytes, the Hub has 10240"):
        hub.verify("checkpoint", dest, endpoint=fake_hub.url)


def test_verify_without_verify_repo_checksums_uses_the_tree_sha256(fake_hub, tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    dest = tmp_path / "ckpt"
    hub.download("checkpoint", dest, endpoint=fake_hub.url, verify_after=False, progress=False)
    monkeypatch.delattr(HfApi, "verify_repo_checksums")  # as on huggingface_hub 0.x
    v = hub.verify("checkpoint", dest, endpoint=fake_hub.url)
    assert v["checksum_method"] == "sha256 from the repo tree" and v["checksums_checked"] == 1  # the one LFS file
    data = bytearray((dest / BIG).read_bytes())
    data[7] ^= 1
    (dest / BIG).write_bytes(bytes(data))
    with pytest.raises(hub.HubVerifyError, match="sha256 differs"):
        hub.verify("checkpoint", dest, endpoint=fake_hub.url)


def test_killed_mid_file_then_rerun_verifies_clean_and_removes_the_stale_file(tmp_path):
    """SIGKILL the CLI and its download child while they are inside the big file (the server
    stalls there), then rerun: the download completes, verify passes, the stale ``.incomplete``
    huggingface_hub left is reported and removed."""
    dest = tmp_path / "dit4dit-model"
    with LocalHub() as server:
        server.add(LocalRepo(ASSETS["checkpoint"].repo_id, _ckpt_files(3_000_000)))
        server.stall(BIG, at=1_000_000, seconds=120)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "tutorial_utils", "hub", "download", "checkpoint", "--dest", str(dest)]
        proc = subprocess.Popen(
            [*cmd, "--endpoint", server.url], env=env, start_new_session=True, stderr=subprocess.DEVNULL
        )
        try:
            assert server.stalled.wait(60), "the download never reached the big file"
            deadline = time.monotonic() + 20
            while not hub.stale_incomplete(dest) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        stale = hub.stale_incomplete(dest)
        assert stale and not (dest / BIG).exists() and not (dest / "manifest.json").exists()
        with pytest.raises(hub.HubVerifyError, match=f"{BIG}: missing.*Stale partial downloads: ") as info:
            hub.verify("checkpoint", dest, endpoint=server.url)
        stale = hub.stale_incomplete(dest)  # other files may have been in flight too
        assert f"Stale partial downloads: {len(stale)}." in str(info.value)
        out = hub.download("checkpoint", dest, endpoint=server.url, progress=False)
    assert out["verify"]["ok"] and set(stale) <= set(out["verify"]["stale_incomplete"])
    assert hub.stale_incomplete(dest) == []
    manifest = json.loads((dest / "manifest.json").read_text())
    assert set(stale) <= set(manifest["stale_incomplete_removed"])


def test_plan_refuses_a_download_that_does_not_fit(tmp_path, small_disk):
    with LocalHub() as server:
        server.add(LocalRepo(ASSETS["checkpoint"].repo_id, _ckpt_files(3_000_000)))
        fill(small_disk, leave=1_000_000)
        p = hub.plan("checkpoint", endpoint=server.url, dest=small_disk / "ckpt")
        assert p["fits"] is False and p["needed_bytes"] > p["free_bytes"]
        with pytest.raises(DiskFull, match=r"does not fit, nothing was fetched\. Disk plan: .*3 files"):
            hub.download("checkpoint", small_disk / "ckpt", endpoint=server.url, progress=False)
        assert not any(m == "GET" and "/resolve/" in u for m, u in server.log)


def test_disk_filling_up_mid_download_is_disk_full_with_the_plan(tmp_path, small_disk):
    """The plan fits, then another writer fills the disk while the big file streams."""
    with LocalHub() as server:
        server.add(LocalRepo(ASSETS["checkpoint"].repo_id, _ckpt_files(2_000_000)))

        def fill_on_big_get(method, path):
            if method == "GET" and path.endswith(BIG):
                fill(small_disk)

        server.hooks.append(fill_on_big_get)
        with pytest.raises(DiskFull, match=r"no space left during the download.*Disk plan: .*free at"):
            hub.download("checkpoint", small_disk / "ckpt", endpoint=server.url, progress=False)
    assert not (small_disk / "ckpt" / "manifest.json").exists()


# --- the downloaded dataset flows on -----------------------------------------------------------------


@pytest.mark.slow
def test_downloaded_dataset_flows_into_metadata_validate_and_a_2_step_training(fake_hub, tmp_path, capsys):
    from tutorial_utils.data import modality, stats
    from tutorial_utils.data.cli import main as dataset_main
    from tutorial_utils.logs import parse_train_log
    from tutorial_utils.train.cli import main as train_main

    dest = tmp_path / "libero_spatial_no_noops_1.0.0_lerobot"
    hub.download("dataset:libero_spatial", dest, endpoint=fake_hub.url, progress=False)
    modality.build_modality(dest)
    assert (dest / "meta/modality.json").is_file()
    st = stats.compute_all(dest)
    assert st["num_trajectories"] == 2 and (dest / "meta/stats_gr00t.json").is_file()
    assert dataset_main(["validate", str(dest)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["modality"] == "ok"
    hub.verify("dataset:libero_spatial", dest, endpoint=fake_hub.url)  # our meta files do not break it
    tiny = {k: v for k, v in TINY_MINI.items() if k not in ("scheduler_warmup_steps", "val_samples")}
    overrides = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in tiny.items()]
    out = tmp_path / "run"
    argv = ["--dataset", str(dest), "--output-dir", str(out), "steps=2", "batch_size=1", "logging_frequency=1"]
    assert train_main([*argv, *overrides]) == 0
    log = parse_train_log(out / "train.log")
    assert [s["step"] for s in log["steps"]] == [1, 2] and log["final_model"]


# --- a dataset archive from a URL ---------------------------------------------------------------------


def _tar(path, folder, arcname, extra: list | None = None):
    import tarfile

    with tarfile.open(path, "w:gz") as t:
        t.add(folder, arcname=arcname)
        for info, data in extra or []:
            t.addfile(info, data)
    return path


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    import io
    import shutil
    import tarfile

    from tutorial_utils.data.synth import generate_dataset

    tmp = tmp_path_factory.mktemp("arch")
    root = generate_dataset(tmp / "my_dataset", n_episodes=2, mean_length=6, image_size=32)
    files = {"my_dataset.tar.gz": _tar(tmp / "a.tgz", root, "my_dataset").read_bytes()}
    files["flat.zip"] = Path(shutil.make_archive(str(tmp / "flat"), "zip", root)).read_bytes()
    evil = tarfile.TarInfo("../evil.txt")
    evil.size = 4
    files["evil.tar.gz"] = _tar(tmp / "e.tgz", root, "my_dataset", [(evil, io.BytesIO(b"evil"))]).read_bytes()
    link = tarfile.TarInfo("my_dataset/meta/link")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    files["link.tar.gz"] = _tar(tmp / "l.tgz", root, "my_dataset", [(link, None)]).read_bytes()
    files["notadataset.tar"] = _plain_tar(tmp / "n.tar")
    return files


def _plain_tar(path):
    import tarfile

    (path.parent / "readme.txt").write_text("hello")
    with tarfile.open(path, "w") as t:
        t.add(path.parent / "readme.txt", arcname="readme.txt")
    return path.read_bytes()


def test_dataset_archive_from_a_url(archives, tmp_path, capsys):
    import hashlib

    from tutorial_utils.data.cli import main as dataset_main
    from tutorial_utils.data.reader import LeRobotDataset
    from tutorial_utils.hub.archive import ArchiveError, fetch_archive

    with LocalHub() as server:
        server.add(LocalRepo("someone/archives", archives, "dataset"))
        base = f"{server.url}/datasets/someone/archives/resolve/main"
        sha = hashlib.sha256(archives["my_dataset.tar.gz"]).hexdigest()
        assert dataset_main(["import-url", f"{base}/my_dataset.tar.gz", str(tmp_path / "a"), "--sha256", sha]) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["sha256"] == sha and out["validate"]
        assert LeRobotDataset(tmp_path / "a").num_episodes == 2
        res = fetch_archive(f"{base}/flat.zip", tmp_path / "b")  # no top folder: the archive is the dataset
        assert res["files"] > 5 and (tmp_path / "b/meta/info.json").is_file()
        with pytest.raises(ArchiveError, match="already exists"):
            fetch_archive(f"{base}/flat.zip", tmp_path / "b")
        with pytest.raises(ArchiveError, match="sha256 .* differs"):
            fetch_archive(f"{base}/my_dataset.tar.gz", tmp_path / "c", sha256="0" * 64)
        with pytest.raises(ArchiveError, match=r"'\.\./evil\.txt' would be written outside"):
            fetch_archive(f"{base}/evil.tar.gz", tmp_path / "d")
        with pytest.raises(ArchiveError, match="is a link"):
            fetch_archive(f"{base}/link.tar.gz", tmp_path / "e")
        with pytest.raises(ArchiveError, match="no LeRobot dataset"):
            fetch_archive(f"{base}/notadataset.tar", tmp_path / "f")
        with pytest.raises(ArchiveError, match="HTTP 404"):
            fetch_archive(f"{base}/missing.tar", tmp_path / "g")
        server.truncate("my_dataset.tar.gz", at=100, times=-1)
        with pytest.raises(ArchiveError, match="cut short"):
            fetch_archive(f"{base}/my_dataset.tar.gz", tmp_path / "h")
    assert not (tmp_path / "evil.txt").exists()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == [] and sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


# --- the download job ---------------------------------------------------------------------------------


def test_download_job_local_plans_downloads_verifies_and_records_the_manifest(tmp_path):
    from tutorial_utils import jobs
    from tutorial_utils.data.synth import generate_dataset
    from tutorial_utils.errors import ConfigError
    from tutorial_utils.hub import job

    src = generate_dataset(tmp_path / "src", n_episodes=2, mean_length=6, image_size=32)
    run = jobs.ensure_run_dir(tmp_path / "run", "download")
    out = job.run_job(run, local_source=src, asset="dataset:libero_goal", dest="run", endpoint="local")
    signs = jobs.read_status(run)["success_signs"]
    manifest = json.loads(open(signs["manifest"]).read())
    assert manifest["repo_id"] == "IPEC-COMMUNITY/libero_goal_no_noops_1.0.0_lerobot"
    assert signs["verified_files"] == signs["planned_files"] == len(manifest["files"]) > 5 and signs["fits"]
    assert out["dest"] == str(run / "libero_goal_no_noops_1.0.0_lerobot") and (run / "plan.json").is_file()
    dry = jobs.ensure_run_dir(tmp_path / "dry", "download")
    job.run_job(dry, local_source=src, dest=str(tmp_path / "never"), endpoint="local", dry_run="true")
    assert "manifest" not in jobs.read_status(dry)["success_signs"] and not (tmp_path / "never").exists()
    with pytest.raises(ConfigError, match="local_source"):
        job.run_job(dry, endpoint="local")
    with pytest.raises(ConfigError, match="unknown Hub asset"):
        job.run_job(dry, local_source=src, asset="dataset:nope", endpoint="local")


@pytest.mark.slow
def test_download_job_notebook_runs_offline_under_the_ci_profile(runs_dir):
    from tutorial_utils import jobs

    res = jobs.run_notebook("notebooks/jobs/download.md")
    status = json.loads((res.run_dir / "status.json").read_text())
    assert status["state"] == "succeeded" and status["success_signs"]["manifest"].endswith("manifest.json")
    assert "local stand-in" in (res.run_dir / "job.log").read_text()


@pytest.mark.slow
def test_progress_bar_on_request_and_none_by_default_when_not_a_tty(fake_hub, tmp_path, capfd):
    hub.download("checkpoint", tmp_path / "a", endpoint=fake_hub.url, progress=True, verify_after=False)
    assert "100%" in capfd.readouterr().err  # huggingface_hub's tqdm bars, on stderr
    hub.download("checkpoint", tmp_path / "b", endpoint=fake_hub.url, verify_after=False)
    assert "100%" not in capfd.readouterr().err


def test_cli_serve_then_plan_against_it(tmp_path):
    from tutorial_utils.data.synth import generate_dataset

    src = generate_dataset(tmp_path / "src", n_episodes=1, mean_length=4, image_size=32)
    cmd = [sys.executable, "-m", "tutorial_utils", "hub", "serve", "dataset:libero_spatial", "--source", str(src)]
    # started with SIGINT ignored, as a background job of a script or nohup starts it: Ctrl-C must still stop it
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)
    )
    try:
        line = proc.stdout.readline()
        assert "local stand-in for the Hub" in line
        url = line.rsplit(" ", 1)[-1].strip()
        plan = [sys.executable, "-m", "tutorial_utils", "hub", "plan", "dataset:libero_spatial", "--endpoint", url]
        out = subprocess.run(plan, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "meta/info.json" in out.stdout and "bytes" in out.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0


# --- stop and resume (issue 25) ----------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _start_stalled_download(server, dest):
    server.add(LocalRepo(ASSETS["checkpoint"].repo_id, _ckpt_files(3_000_000)))
    server.stall(BIG, at=1_000_000, seconds=120)
    cmd = [sys.executable, "-m", "tutorial_utils", "hub", "download", "checkpoint", "--dest", str(dest)]
    proc = subprocess.Popen(  # a read timeout longer than the test: the child cannot end by itself
        [*cmd, "--endpoint", server.url, "--timeout", "300"], env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
        stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    assert server.stalled.wait(60), "the download never reached the big file"
    kids = _children(proc.pid)
    assert len(kids) == 1, kids
    return proc, kids[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killing_hub_download_stops_its_download_child(tmp_path, sig):
    """`kill` (SIGTERM) of the CLI stops its snapshot_download child before it exits; even SIGKILL,
    which the CLI cannot handle, takes the child along (PR_SET_PDEATHSIG): nothing is left re-parented."""
    with LocalHub() as server:
        proc, child = _start_stalled_download(server, tmp_path / "dit4dit-model")
        try:
            os.kill(proc.pid, sig)  # the CLI only, not its process group
            proc.wait(30)
            deadline = time.monotonic() + 8
            while _alive(child) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not _alive(child), f"the download child {child} outlived `hub download` ({sig!r})"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    if sig == signal.SIGTERM:
        assert proc.returncode != 0


def test_rerun_after_a_kill_resumes_exactly_when_the_installed_library_says_so(tmp_path):
    """The claim the help and chapter 7 print (`resumes_interrupted_files`) against what the
    installed huggingface_hub does: a rerun after a kill mid-file asks for the rest with a Range
    request only if it resumes."""
    dest = tmp_path / "dit4dit-model"
    with LocalHub() as server:
        proc, _ = _start_stalled_download(server, dest)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        server.faults.clear()
        server.ranges.clear()
        out = hub.download("checkpoint", dest, endpoint=server.url, progress=False)
        gets = [r for m, path, r in server.ranges if m == "GET" and path.endswith(BIG)]
    assert out["verify"]["ok"] and gets
    resumed = any(r.startswith("bytes=") and not r.startswith("bytes=0-") for r in gets)
    claim = hub.resumes_interrupted_files()
    assert claim is not None, "the installed huggingface_hub's behaviour is not known to the package"
    assert resumed == claim, (gets, claim)
    assert hub.resume_note().endswith("(finished files are kept)") != claim


def test_chapter7_reads_manifest_keys_that_exist(fake_hub, tmp_path):
    """Chapter 7 prints manifest fields; each must be a key verify writes (a misspelt key printed an
    always-empty list of removed stale files)."""
    import re

    text = (Path(__file__).parents[1] / "notebooks" / "07_dit4dit_gpu_path.md").read_text()
    keys = set(re.findall(r"manifest(?:\[|\.get\()['\"](\w+)['\"]", text))
    keys |= {k for group in re.findall(r"manifest\[k\] for k in \(([^)]*)\)", text) for k in re.findall(r"\w+", group)}
    assert "stale_incomplete_removed" in keys
    dest = tmp_path / "ckpt"
    hub.download("checkpoint", dest, endpoint=fake_hub.url, progress=False)
    manifest = json.loads((dest / hub.MANIFEST).read_text())
    assert keys <= set(manifest), keys - set(manifest)
