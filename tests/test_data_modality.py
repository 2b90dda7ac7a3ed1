"""meta/modality.json: the LIBERO preset equals DiT4DiT's mapping; every bad entry is named."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from tutorial_utils.data.modality import (
    LIBERO_MODALITY,
    ModalityError,
    build_modality,
    modality_table,
    validate_modality,
)
from tutorial_utils.data.synth import generate_dataset


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return generate_dataset(tmp_path_factory.mktemp("m") / "d", n_episodes=1, mean_length=6, image_size=32)


def test_libero_preset_is_dit4dit_mapping(tiny, tmp_path):
    root = shutil.copytree(tiny, tmp_path / "d")
    m = build_modality(root)
    assert json.loads((root / "meta/modality.json").read_text()) == m == LIBERO_MODALITY
    assert [(k, v["start"], v["end"]) for k, v in m["state"].items()] == [
        ("x", 0, 1),
        ("y", 1, 2),
        ("z", 2, 3),
        ("roll", 3, 4),
        ("pitch", 4, 5),
        ("yaw", 5, 6),
        ("pad", 6, 7),
        ("gripper", 7, 8),
    ]
    assert m["action"]["gripper"] == {"start": 6, "end": 7} and len(m["action"]) == 7
    assert m["video"] == {
        "primary_image": {"original_key": "observation.images.image"},
        "wrist_image": {"original_key": "observation.images.wrist_image"},
    }
    assert m["annotation"] == {"human.action.task_description": {"original_key": "task_index"}}
    summary = validate_modality(root)
    assert summary["uncovered"] == {} and summary["state"]["gripper"] == ("observation.state", 7, 8)
    assert len(modality_table(m)) == 8 + 7 + 2 + 1


def test_generic_preset(tiny):
    m = build_modality(tiny, preset="generic", write=False)
    assert m["state"]["gripper"] == {"start": 6, "end": 8}  # two equal names merge
    assert m["action"]["gripper"] == {"start": 6, "end": 7}
    assert m["video"]["wrist_image"] == {"original_key": "observation.images.wrist_image"}
    assert validate_modality(tiny, m)["uncovered"] == {}


def _bad(**edits):
    m = copy.deepcopy(LIBERO_MODALITY)
    for path, value in edits.items():
        group, name, *field = path.split("__")
        if field:
            m[group][name][field[0]] = value
        else:
            m[group][name] = value
    return m


@pytest.mark.parametrize(
    "edits,match",
    [
        (
            {"state__gripper__end": 9},
            r"\[state\.gripper\]: slice \[7:9\] is outside observation\.state .*Fix: use 0 <= start < end <= 8",
        ),
        ({"action__gripper__start": -1}, r"\[action\.gripper\]: slice"),
        ({"state__pad__end": 6}, r"\[state\.pad\]: slice \[6:6\]"),
        ({"state__yaw__end": 7}, r"\[state\.pad\]: slice \[6:7\] of observation\.state overlaps state\.yaw"),
        (
            {"state__extra": {"start": 0, "end": 2}},
            r"\[state\.extra\]: .*overlaps state\.x.*Fix: make the slices disjoint",
        ),
        (
            {"state__x__original_key": "observation.joints"},
            r"\[state\.x\]: original_key 'observation\.joints' is not a feature",
        ),
        ({"state__x__original_key": "observation.images.image"}, r"\[state\.x\]: .*is a video feature"),
        ({"state__x__dtype": "text"}, r"\[state\.x\]: dtype 'text'"),
        ({"state__x__start": "0"}, r"\[state\.x\]: 'start' must be an integer"),
        ({"state__x__absolute": "yes"}, r"\[state\.x\]: absolute must be true or false"),
        ({"state__roll__rotation_type": "spin"}, r"\[state\.roll\]: rotation_type 'spin'"),
        ({"state__x__colour": "red"}, r"\[state\.x\]: unknown fields \['colour'\]"),
        ({"video__primary_image": {"original_key": "observation.state"}}, r"\[video\.primary_image\]: .*not a video"),
        (
            {"video__primary_image": {"original_key": "observation.images.front"}},
            r"\[video\.primary_image\]: original_key",
        ),
        (
            {"annotation__human.action.task_description": {"original_key": "language"}},
            r"\[annotation\.human\.action\.task_description\]",
        ),
    ],
)
def test_bad_entries(tiny, edits, match):
    with pytest.raises(ModalityError, match=match):
        validate_modality(tiny, _bad(**edits))


def test_bad_files(tiny, tmp_path):
    root = shutil.copytree(tiny, tmp_path / "d")
    with pytest.raises(ModalityError, match=r"modality\.json is missing.*Fix: build it"):
        validate_modality(root)
    (root / "meta/modality.json").write_text("{oops")
    with pytest.raises(ModalityError, match="not valid JSON"):
        validate_modality(root)
    m = copy.deepcopy(LIBERO_MODALITY)
    m["language"] = {}
    with pytest.raises(ModalityError, match=r"\[language\]: unknown group"):
        validate_modality(root, m)
    del m["language"], m["action"]
    with pytest.raises(ModalityError, match=r"\[action\]: group is missing"):
        validate_modality(root, m)


def test_build_refuses_wrong_dataset_and_writes_nothing(tmp_path):
    root = generate_dataset(tmp_path / "d", n_episodes=1, mean_length=5, image_size=32)
    info = json.loads((root / "meta/info.json").read_text())
    info["features"]["observation.state"]["shape"] = [6]
    (root / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(ModalityError, match=r"\[state\.yaw\]|\[state\.pad\]"):
        build_modality(root)
    assert not (root / "meta/modality.json").exists()
