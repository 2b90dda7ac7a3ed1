"""The hub stage against a local stand-in for the Hub (stdlib http.server on 127.0.0.1).

The server speaks just what huggingface_hub uses for ``repo_info``, ``list_repo_tree`` and
``snapshot_download``: revision info, the recursive tree, ``resolve`` with HEAD/GET, ETag,
X-Repo-Commit, Content-Length and Range, and errors through ``X-Error-Code``. It serves a
dataset the project generates as ``dataset:libero_spatial``, a small fake checkpoint as
``checkpoint`` and a gated ``cosmos`` on a slashed revision.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import pytest

from tutorial_utils.hub import download as hub
from tutorial_utils.hub.assets import ASSETS, get_asset

GOOD_TOKEN = "hf_test_good_token_0123456789"
NO_ACCESS_TOKEN = "hf_test_no_access_0123456789"


class Repo:
    def __init__(self, repo_id: str, repo_type: str, files: dict[str, bytes], revisions=("main",), gated=False):
        self.repo_id, self.repo_type, self.files, self.gated = repo_id, repo_type, files, gated
        self.commit = hashlib.sha1(repo_id.encode()).hexdigest()
        self.revisions = {r: self.commit for r in revisions} | {self.commit: self.commit}

    def entry(self, path: str) -> dict:
        data = self.files[path]
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        out = {"type": "file", "path": path, "size": len(data), "oid": blob}
        if not path.endswith((".json", ".jsonl", ".yaml")):  # binaries are LFS files, as on the Hub
            out["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return out


class FakeHub:
    def __init__(self):
        self.repos: dict[tuple[str, str], Repo] = {}
        self.log: list[tuple[str, str]] = []
        hubself = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_HEAD(self):
                hubself.handle(self, head=True)

            def do_GET(self):
                hubself.handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, repo: Repo) -> Repo:
        self.repos[(repo.repo_type, repo.repo_id)] = repo
        return repo

    @staticmethod
    def _send(h, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, str(v))
        h.send_header("Content-Length", str((headers or {}).get("Content-Length", len(body))))
        h.end_headers()
        if not head and body:
            h.wfile.write(body)

    def _error(self, h, status, code=None, message=None, head=False):
        headers = {"Content-Type": "application/json"}
        if code:
            headers["X-Error-Code"] = code
        if message:
            headers["X-Error-Message"] = message
        self._send(h, status, json.dumps({"error": message or code}).encode(), headers, head)

    def _split_rev(self, repo: Repo, rest: str) -> tuple[str | None, str]:
        """'<revision>/<path>' with a revision that may contain slashes."""
        for rev in sorted(repo.revisions, key=len, reverse=True):
            if rest == rev or rest.startswith(rev + "/"):
                return rev, rest[len(rev) + 1 :]
        return None, rest

    def _auth(self, h, repo: Repo, head: bool) -> bool:
        if not repo.gated:
            return True
        auth = h.headers.get("Authorization", "")
        if auth == f"Bearer {GOOD_TOKEN}":
            return True
        if auth == f"Bearer {NO_ACCESS_TOKEN}":
            self._error(
                h, 403, "GatedRepo", "Access to model is restricted and you are not in the authorized list.", head
            )
        elif auth:
            self._error(h, 401, None, "Invalid credentials in Authorization header", head)
        else:
            self._error(h, 401, "GatedRepo", "Access to model is restricted. You must be authenticated.", head)
        return False

    def handle(self, h, head: bool):
        split = urlsplit(h.path)
        self.log.append((h.command, h.path))
        parts = split.path.split("/")[1:]
        api = parts[:1] == ["api"]
        if api:
            repo_type, parts = parts[1].rstrip("s"), parts[2:]
        elif parts[:1] == ["datasets"]:
            repo_type, parts = "dataset", parts[1:]
        else:
            repo_type = "model"
        repo_id, kind, rest = "/".join(parts[:2]), parts[2] if len(parts) > 2 else "", "/".join(parts[3:])
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:
            return self._error(h, 401, "RepoNotFound", "Repository not found", head)
        if not self._auth(h, repo, head):
            return None
        rev, path = self._split_rev(repo, unquote(rest))
        if rev is None:
            return self._error(h, 404, "RevisionNotFound", "Invalid rev id", head)
        sha = repo.revisions[rev]
        if api and kind == "revision":
            body = {"id": repo.repo_id, "sha": sha, "private": False, "gated": "manual" if repo.gated else False}
            body["siblings"] = [{"rfilename": p} for p in sorted(repo.files)]
            return self._send(h, 200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)
        if api and kind == "tree":
            pre = path.rstrip("/") + "/" if path else ""
            entries = [repo.entry(p) for p in sorted(repo.files) if p.startswith(pre)]
            return self._send(h, 200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, head)
        if not api and kind == "resolve":
            if path not in repo.files:
                return self._error(h, 404, "EntryNotFound", "Entry not found", head)
            data, entry = repo.files[path], repo.entry(path)
            etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
            headers = {"X-Repo-Commit": sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
            status, rng = 200, h.headers.get("Range")
            if rng and rng.startswith("bytes="):
                start_s, _, end_s = rng[6:].partition("-")
                start, end = int(start_s), int(end_s) if end_s else len(data) - 1
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                data, status = data[start : end + 1], 206
            return self._send(h, status, data, headers, head)
        return self._error(h, 404, None, f"not served: {h.path}", head)


@pytest.fixture(scope="module")
def fake_hub(tmp_path_factory):
    from tutorial_utils.data.synth import generate_dataset

    root = generate_dataset(tmp_path_factory.mktemp("ds") / "d", n_episodes=2, mean_length=8, image_size=32)
    ds_files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    server = FakeHub()
    server.add(Repo(ASSETS["dataset:libero_spatial"].repo_id, "dataset", ds_files))
    ckpt = {
        "dit4dit_libero/final_model/pytorch_model.pt": bytes(range(256)) * 40,
        "dit4dit_libero/config.yaml": b"framework:\n  cosmos25:\n    base_model: /path/to/Cosmos-Predict2.5-2B\n",
        "dit4dit_libero/dataset_statistics.json": b'{"libero_franka": {}}',
        "dit4dit_robocasa/final_model/pytorch_model.pt": b"\0" * 5000,  # must not be fetched
        "README.md": b"# DiT4DiT\n",
    }
    server.add(Repo(ASSETS["checkpoint"].repo_id, "model", ckpt))
    cosmos = {"model_index.json": b'{"_class_name": "Cosmos"}', "transformer/weights.safetensors": b"\1" * 3000}
    server.add(Repo(ASSETS["cosmos"].repo_id, "model", cosmos, revisions=("diffusers/base/post-trained",), gated=True))
    yield server
    server.server.shutdown()


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
    assert paths == sorted(k for k in fake_hub.repos[("model", p["repo_id"])].files if k.startswith("dit4dit_libero/"))
    assert p["total_bytes"] == sum(f["size"] for f in p["files"]) and p["n_files"] == 3
    assert p["fits"] is True
    assert main(["plan", "dataset:libero_spatial", "--endpoint", fake_hub.url]) == 0
    out = capsys.readouterr().out
    assert "meta/info.json" in out and "bytes" in out and "IPEC-COMMUNITY/libero_spatial" in out


def test_download_verify_manifest_and_dataset_opens(fake_hub, tmp_path):
    from tutorial_utils.data.format import LeRobotDataset

    dest = tmp_path / "libero_spatial_no_noops_1.0.0_lerobot"
    out = hub.download("dataset:libero_spatial", dest, endpoint=fake_hub.url)
    assert out["verify"]["ok"] and out["verify"]["sha256_checked"] > 0
    manifest = json.loads((dest / "manifest.json").read_text())
    repo = fake_hub.repos[("dataset", ASSETS["dataset:libero_spatial"].repo_id)]
    assert manifest["commit"] == repo.commit and manifest["revision"] == "main"
    assert manifest["files"] == {k: len(v) for k, v in repo.files.items()}
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

    with pytest.raises(hub.HubNotFoundError, match="repository not found"):
        hub.plan(get_asset("dataset:libero_goal"), endpoint=fake_hub.url)
    with pytest.raises(hub.HubNotFoundError, match="revision 'nope' not found"):
        hub.download(replace(get_asset("checkpoint"), revision="nope"), tmp_path / "x", endpoint=fake_hub.url)
