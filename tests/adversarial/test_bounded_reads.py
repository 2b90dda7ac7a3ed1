"""Bounded, typed reads (issue 26): every small JSON/YAML file the package reads goes through
``io.read_small``: a regular file only (a FIFO or a symlink to an endless device is refused
without blocking), a size cap, a depth cap, a type check, an error naming the file and the key.

A training run treats a hostile ``control.json`` (deeply nested, a symlink to /dev/zero, a FIFO,
a 50 MB command) as "no command" with one short warning, and keeps training."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import TINY_MLP_RUN
from tutorial_utils.io import SmallFileError, read_json_or_empty, read_small
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.data import synthetic_source
from tutorial_utils.train.loop import train

torch.set_num_threads(1)

BASE = {**TINY_MLP_RUN, "eval_freq": 100, "save_freq": 100, "augment_shift": 0}


# --- the reader ---------------------------------------------------------------------------------


def test_read_small_refuses_what_is_not_a_small_regular_file(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    done = threading.Event()

    def read():
        with pytest.raises(SmallFileError, match="FIFO"):
            read_small(fifo)
        done.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(5)
    assert done.is_set(), "reading a FIFO blocked"

    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    with pytest.raises(SmallFileError, match="not a regular file"):
        read_small(zero)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"command": "x" * 5000}))
    with pytest.raises(SmallFileError, match="over the") as info:
        read_small(big, max_bytes=1000)
    assert "xxxx" not in str(info.value)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(SmallFileError, match="nests deeper"):
        read_small(deep, expect=list)
    deep.write_text(json.dumps({"a": [[[[[[[1]]]]]]]}))
    with pytest.raises(SmallFileError, match="nests deeper than 4"):
        read_small(deep, max_depth=4)
    yml = tmp_path / "deep.yaml"
    yml.write_text("a: " + "[" * 5000 + "]" * 5000)
    with pytest.raises(SmallFileError, match="nests deeper|not YAML"):
        read_small(yml)
    assert read_json_or_empty(fifo) == {} and read_json_or_empty(zero) == {} and read_json_or_empty(yml) == {}
    assert read_json_or_empty(tmp_path / "missing.json") == {}


def test_read_small_names_the_file_and_the_key(tmp_path):
    f = tmp_path / "manifest.json"
    f.write_text(json.dumps({"step": "12", "ok": True}))
    with pytest.raises(SmallFileError) as info:
        read_small(f, schema={"step": int}, fix="export it again")
    msg = str(info.value)
    assert str(f) in msg and "[step]" in msg and "expected int" in msg and "export it again" in msg
    with pytest.raises(SmallFileError, match=r"\[size\]: has no 'size'"):
        read_small(f, required=("size",))
    f.write_text(json.dumps({"step": True}))
    with pytest.raises(SmallFileError, match="bool"):
        read_small(f, schema={"step": int})
    f.write_text("[1, 2]")
    with pytest.raises(SmallFileError, match="holds list"):
        read_small(f)
    f.write_bytes(b"\xff\xfe{}")
    with pytest.raises(SmallFileError, match="not UTF-8"):
        read_small(f)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=300), _json_values.map(lambda v: json.dumps(v).encode())))
def test_fuzz_the_readers_of_control_manifests_and_listings(tmp_path, data):
    """Whatever the bytes, the reader returns the typed object or raises SmallFileError (never
    another exception), and read_json_or_empty returns a dict."""
    from tutorial_utils.policies.checkpoint import MANIFEST_SCHEMA
    from tutorial_utils.train.control import CONTROL_SCHEMA

    f = tmp_path / "f.json"
    f.write_bytes(data)
    for schema in (CONTROL_SCHEMA, MANIFEST_SCHEMA, {"size": int, "path": str}):
        try:
            out = read_small(f, schema=schema, max_depth=8)
        except SmallFileError as exc:
            assert str(f) in str(exc) and "Fix:" in str(exc)
        else:
            assert isinstance(out, dict)
            for key, types in schema.items():
                if key in out:
                    assert isinstance(out[key], types)
    assert isinstance(read_json_or_empty(f), dict)


# --- a training run against a hostile control.json ----------------------------------------------


@pytest.fixture(scope="module")
def source():
    return synthetic_source(n_episodes=5, length=12, image_size=16)


def _hostile(kind: str, path: Path) -> None:
    path.unlink(missing_ok=True)
    if kind == "deep":
        path.write_text('{"command": ' + "[" * 200_000 + "]" * 200_000 + "}")
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "huge":
        path.write_text(json.dumps({"command": "stop" + "x" * (50 << 20)}))
    elif kind == "typed":
        path.write_text(json.dumps({"command": ["stop"], "time": "now"}))


@pytest.mark.parametrize("kind", ["deep", "zero", "fifo", "huge", "typed"])
def test_a_hostile_control_file_is_no_command_and_training_goes_on(tmp_path, source, kind):
    run = tmp_path / "r"

    def scribble(step, loss):
        if step == 2:
            _hostile(kind, run / "control.json")

    res = train(
        TrainConfig.from_overrides({**BASE, "output_dir": str(run), "steps": 5}), source=source, on_step=scribble
    )
    assert res.stopped_by is None and res.steps_done == 5
    log = (run / "train.log").read_text()
    warnings = [ln for ln in log.splitlines() if "control.json" in ln and "warning" in ln]
    assert len(warnings) == 1, warnings
    assert len(warnings[0]) < 500 and "xxxxxxxxxx" not in log
    assert (run / "train.log").stat().st_size < 200_000
