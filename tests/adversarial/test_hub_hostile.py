"""The hub stage against a hostile endpoint (issue 26): a 5xx whose error text echoes the
Authorization header, a file listing with a string, null or negative size, a redirect loop.
``hub plan`` and ``hub download`` must answer with one short teaching line on stderr, exit 1,
and never print the token (nor write it into the destination)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

TOKEN = "hf_" + "Plant3dSecretTokenXYZ0123456789abcd"  # planted fake, split for scanners
SHORT = "hf_x9k2"  # a short one: the shape alone must be masked
REPO_SHA = "0" * 40


def _handler(mode: str):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _json(self, status: int, obj, headers: dict | None = None):
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            auth = self.headers.get("Authorization", "")
            if mode == "echo500":
                echoed = f"upstream failed for request with Authorization: {auth} (token {auth.split()[-1]})"
                return self._json(500, {"error": echoed}, {"X-Error-Message": echoed})
            if mode == "redirect":
                self.send_response(302)
                self.send_header("Location", self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            if "/revision/" in self.path:
                return self._json(200, {"id": "x/y", "sha": REPO_SHA, "siblings": []})
            if "/tree/" in self.path:
                size = {"badsize_str": "abc", "badsize_null": None, "badsize_neg": -5}[mode]
                return self._json(
                    200, [{"type": "file", "path": "dit4dit_libero/config.yaml", "oid": "1" * 40, "size": size}]
                )
            return self._json(404, {"error": "no"})

        do_HEAD = do_GET

    return H


@pytest.fixture
def endpoint(request):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(request.param))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _cli(args: list[str], token: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HF_TOKEN": token,
        "HF_HOME": str(tmp_path / "hf_home"),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_ETAG_TIMEOUT": "3",
        "HF_HUB_DOWNLOAD_TIMEOUT": "3",
    }
    return subprocess.run(
        [sys.executable, "-m", "tutorial_utils", "hub", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _no_token_anywhere(proc, tmp_path: Path, token: str) -> None:
    for text in (proc.stdout, proc.stderr):
        assert token not in text and token[3:] not in text
    for p in tmp_path.rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert token.encode() not in p.read_bytes(), p


@pytest.mark.parametrize("endpoint", ["echo500"], indirect=True)
@pytest.mark.parametrize("token", [TOKEN, SHORT], ids=["long-token", "short-token"])  # never a token in a test id
@pytest.mark.parametrize("action", ["plan", "download"])
def test_a_5xx_echoing_the_authorization_header_never_prints_the_token(endpoint, token, action, tmp_path):
    proc = _cli([action, "checkpoint", "--endpoint", endpoint, "--dest", str(tmp_path / "dest")], token, tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "***" in proc.stderr  # the echo is there, masked
    _no_token_anywhere(proc, tmp_path, token)


@pytest.mark.parametrize("endpoint", ["badsize_str", "badsize_null", "badsize_neg"], indirect=True)
def test_a_listing_with_a_bad_size_is_a_teaching_error(endpoint, tmp_path):
    proc = _cli(["plan", "checkpoint", "--endpoint", endpoint], TOKEN, tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "config.yaml" in proc.stderr and "size" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    _no_token_anywhere(proc, tmp_path, TOKEN)


@pytest.mark.parametrize("endpoint", ["redirect"], indirect=True)
def test_a_redirect_loop_is_a_teaching_error(endpoint, tmp_path):
    proc = _cli(["plan", "checkpoint", "--endpoint", endpoint], TOKEN, tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Fix:" in proc.stderr
    _no_token_anywhere(proc, tmp_path, TOKEN)
