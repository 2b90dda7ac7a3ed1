"""LeRobot dataset format v2.1: typing the parquet columns. A numeric feature's column must hold
numbers of the feature's shape and, where checked, finite ones; a column read here comes back as
a ``(T, *shape)`` numpy array. The writer, the reader and the statistics use these checks, so a
bad column is named the same way wherever it is met.

``pyarrow`` is imported inside the functions that need it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tutorial_utils.data.schema import NON_NUMERIC_DTYPES
from tutorial_utils.errors import DatasetError


def arrow_value_type(typ):
    """The element type of a (fixed-size / large) list Arrow type, else the type itself."""
    import pyarrow as pa

    while pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        typ = typ.value_type
    return typ


def check_column_type(path: Path, key: str, typ, ft: dict) -> None:
    """A parquet column of a numeric feature must hold numbers (or lists of numbers): a column of
    strings raises :class:`DatasetError` naming the file and the column."""
    import pyarrow as pa

    if ft.get("dtype") in NON_NUMERIC_DTYPES:
        return
    value = arrow_value_type(typ)
    if not (pa.types.is_integer(value) or pa.types.is_floating(value) or pa.types.is_boolean(value)):
        raise DatasetError(
            path,
            key,
            f"the column holds {typ}, but meta/info.json says dtype {ft.get('dtype')} (numbers)",
            "re-write the episode with numeric values (the dataset's writer does), or re-download it",
        )


NON_FINITE_FIX = (
    "re-record or drop this episode (NaN/inf would poison the statistics and the training loss); "
    "check the recorder or the conversion that wrote it"
)


def check_finite(path: Path, key: str, values: np.ndarray, frames: np.ndarray | None = None) -> None:
    """NaN or inf in a numeric column raises :class:`DatasetError` naming the file, the column and
    the first bad frame (``frames``: the frame index of each row, default the row number)."""
    a = np.asarray(values)
    if a.dtype.kind not in "fc" or a.size == 0:
        return
    flat = a.reshape(len(a), -1)
    bad = ~np.isfinite(flat)
    if not bad.any():
        return
    row = int(np.flatnonzero(bad.any(axis=1))[0])
    dim = int(np.flatnonzero(bad[row])[0])
    frame = row if frames is None else np.asarray(frames).reshape(-1)[row]
    frame = int(frame) if np.isfinite(frame) else row  # a frame_index column may itself be broken
    raise DatasetError(
        path,
        key,
        f"{int(bad.sum())} non-finite value(s); the first is {flat[row, dim]} at frame {frame} (dim {dim})",
        NON_FINITE_FIX,
    )


def column_to_numpy(table, key: str, ft: dict, path: Path) -> np.ndarray:
    """A parquet column as (T, *shape) numpy; DatasetError if missing or the wrong shape."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if key not in table.column_names:
        raise DatasetError(
            path,
            key,
            f"column is missing (columns: {table.column_names})",
            "re-write the episode with every feature of meta/info.json, or remove the "
            "feature from info.json if the dataset never had it",
        )
    col = table.column(key).combine_chunks()
    check_column_type(path, key, col.type, ft)
    shape = list(ft["shape"])
    t = len(col)
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_fixed_size_list(col.type):
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        d = int(np.prod(shape))
        if t and (lengths.min() != d or lengths.max() != d):
            raise DatasetError(
                path,
                key,
                f"rows hold {int(lengths.min())}..{int(lengths.max())} values, meta/info.json says shape {shape}",
                "fix the feature's shape in meta/info.json or re-write the episode",
            )
        arr = col.flatten().to_numpy(zero_copy_only=False).reshape(t, *shape)
    else:
        if shape != [1]:
            raise DatasetError(
                path,
                key,
                f"column holds scalars but meta/info.json says shape {shape}",
                "fix the feature's shape in meta/info.json or re-write the episode",
            )
        arr = col.to_numpy(zero_copy_only=False)
    return arr
