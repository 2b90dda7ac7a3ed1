"""Hostile bundles (issue 26): ``runs verify`` and every load of a bundle (``policies.load``,
``serve``) check the manifest first: typed (wrong-typed fields, deep nesting, a path out of the
bundle), regular files only (weights symlinked to a file outside, a symlink loop), one
teaching line from the CLI, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from helpers import TINY_MLP_RUN
from tutorial_utils import policies
from tutorial_utils.runs.cli import main as runs_cli
from tutorial_utils.runs.export import BundleError, export, verify
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.data import synthetic_source
from tutorial_utils.train.loop import train

torch.set_num_threads(1)

BASE = {**TINY_MLP_RUN, "augment_shift": 0}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("b")
    src = synthetic_source(n_episodes=5, length=12, image_size=16)
    train(TrainConfig.from_overrides({**BASE, "output_dir": str(root / "run"), "steps": 4}), source=src)
    export(root / "run/checkpoints/step_000004", root / "bundle")
    return root / "bundle"


def _copy(bundle: Path, tmp_path: Path) -> Path:
    out = tmp_path / "bundle"
    shutil.copytree(bundle, out)
    return out


def _manifest(b: Path, **change) -> None:
    m = json.loads((b / "manifest.json").read_text())
    m.update(change)
    (b / "manifest.json").write_text(json.dumps(m))


def _refused(b: Path, capsys, match: str) -> None:
    with pytest.raises(BundleError, match=match):
        verify(b)
    with pytest.raises(BundleError, match=match):  # loading it (serve, evaluate) checks it first
        policies.load(b)
    assert runs_cli(["verify", str(b)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_an_intact_bundle_verifies_and_loads(bundle):
    assert verify(bundle)["family"] == "mlp"
    assert policies.load(bundle) is not None


def test_weights_symlinked_to_a_file_outside_the_bundle_are_refused(bundle, tmp_path, capsys):
    b = _copy(bundle, tmp_path)
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(b / "model.safetensors", outside)
    os.symlink(outside, b / "model.safetensors")
    _refused(b, capsys, "model.safetensors is a symbolic link")


def test_a_symlink_loop_is_refused_not_followed(bundle, tmp_path, capsys):
    b = _copy(bundle, tmp_path)
    os.symlink("loop", b / "loop")
    os.symlink(".", b / "self")
    _refused(b, capsys, "loop is a symbolic link")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"files": ["model.safetensors"]}, r"\[files\]"),
        ({"step": "4"}, r"\[step\]"),
        ({"files": {"model.safetensors": {"bytes": "12", "sha256": "x"}}}, r"files\.model\.safetensors"),
        ({"files": {"../../etc/passwd": {"bytes": 1, "sha256": "x"}}}, "not a relative path"),
        ({"parity": json.loads("[" * 50 + "]" * 50)}, r"nests deeper|\[parity\]"),
        ({"format": None}, r"\[format\]"),
    ],
)
def test_a_manifest_with_wrong_types_is_refused(bundle, tmp_path, capsys, change, match):
    b = _copy(bundle, tmp_path)
    _manifest(b, **change)
    _refused(b, capsys, match)


def test_an_absurd_model_dim_in_a_config_is_a_teaching_error(bundle, tmp_path):
    b = _copy(bundle, tmp_path)
    (b / "manifest.json").unlink()  # a plain checkpoint folder: the config is all there is
    conf = json.loads((b / "config.json").read_text())
    conf["policy"]["hidden_dim"] = 10**12
    (b / "config.json").write_text(json.dumps(conf))
    from tutorial_utils.policies.base import CheckpointError

    with pytest.raises(CheckpointError, match="hidden_dim"):
        policies.load(b)
