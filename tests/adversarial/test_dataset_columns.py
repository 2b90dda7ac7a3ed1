"""``validate --deep`` checks the bookkeeping columns against the metadata (issue 26): a
``task_index`` that names no task (those frames would train with an empty instruction), and
broken ``episode_index``, ``frame_index``, ``index`` and ``timestamp`` columns, each a
DatasetError naming the file and the column; the CLI says it in one line, exit code 1."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tutorial_utils.data.cli import main as dataset_cli
from tutorial_utils.data.reader import LeRobotDataset
from tutorial_utils.data.synth import generate_dataset
from tutorial_utils.errors import DatasetError

EP1 = "data/chunk-000/episode_000001.parquet"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return generate_dataset(tmp_path_factory.mktemp("cols") / "base", n_episodes=2, mean_length=8, image_size=32)


def rewrite_scalar(path: Path, key: str, fn) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    col = table.column(key).combine_chunks()
    values = fn(col.to_numpy(zero_copy_only=False).copy())
    new = pa.array(values, type=col.type)
    pq.write_table(table.set_column(table.column_names.index(key), key, new), path)


def test_an_intact_dataset_passes_deep(base):
    assert LeRobotDataset(base).validate(deep=True)["ok"]


@pytest.mark.parametrize(
    ("key", "fn", "match"),
    [
        ("task_index", lambda v: v + 57, "name no task"),
        ("episode_index", lambda v: np.zeros_like(v), "disagree with the metadata"),
        ("frame_index", lambda v: v[::-1].copy(), "disagree with the metadata"),
        ("index", lambda v: v - v[0], "disagree with the metadata"),
        ("timestamp", lambda v: (v * 3).astype(v.dtype), "not frame_index / fps"),
    ],
)
def test_validate_deep_checks_the_bookkeeping_columns(base, tmp_path, capsys, key, fn, match):
    ds = shutil.copytree(base, tmp_path / "ds")
    rewrite_scalar(ds / EP1, key, fn)
    with pytest.raises(DatasetError, match=match) as info:
        LeRobotDataset(ds).validate(deep=True)
    assert info.value.key == key and EP1 in info.value.file
    assert dataset_cli(["validate", str(ds), "--deep"]) == 1
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err
