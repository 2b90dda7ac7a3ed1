"""The LIBERO layer: bad input, GL backend detection, flip, state vector, a real env."""

from __future__ import annotations

import numpy as np
import pytest

from tutorial_utils.data.libero_schema import dataset_action_to_env, env_action_to_dataset
from tutorial_utils.sim import libero_env as le


def test_flip_rotates_180_degrees():
    img = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    out = le.flip(img)
    assert out.shape == img.shape and out.flags["C_CONTIGUOUS"]
    assert (out[0, 0] == img[-1, -1]).all() and (out[-1, -1] == img[0, 0]).all()
    assert (le.flip(out) == img).all()


def test_state_vector_layout():
    # 90 degrees about z: quat (x, y, z, w) = (0, 0, sin 45, cos 45)
    s = np.sqrt(0.5)
    obs = {
        "robot0_eef_pos": np.array([0.1, 0.2, 0.3]),
        "robot0_eef_quat": np.array([0, 0, s, s]),
        "robot0_gripper_qpos": np.array([0.04, -0.04]),
    }
    v = le.state_vector(obs)
    assert v.shape == (8,) and v.dtype == np.float32
    np.testing.assert_allclose(v, [0.1, 0.2, 0.3, 0, 0, np.pi / 2, 0.04, -0.04], atol=1e-6)
    np.testing.assert_allclose(le.quat2axisangle(np.array([0, 0, 0, 1.0])), 0)


def test_gripper_conventions_and_noops():
    a = np.array([0.1, 0, 0, 0, 0, 0, -1.0])
    d = env_action_to_dataset(a)
    assert d.dtype == np.float32 and d[6] == 1.0
    np.testing.assert_allclose(dataset_action_to_env(d), a, atol=1e-6)
    z = np.array([0, 0, 0, 0, 0, 0, -1.0])
    assert le.is_noop(z, None)
    assert le.is_noop(z, z)
    assert not le.is_noop(z, -z)  # gripper changes: keep
    assert not le.is_noop(a, None)


def test_objects_of_interest_from_bddl():
    text = "(:obj_of_interest\n    akita_black_bowl_1\n    plate_1\n  )"
    assert le.parse_objects_of_interest(text) == ["akita_black_bowl_1", "plate_1"]


def test_unknown_suite_and_task():
    with pytest.raises(le.LiberoError, match="unknown LIBERO suite 'libero_nope'"):
        le.task_info("libero_nope", 0)
    with pytest.raises(le.LiberoError, match=r"unknown task id 10 .*0\.\.9"):
        le.task_info("libero_spatial", 10)
    with pytest.raises(le.LiberoError, match="render profile"):
        le.make_env("libero_spatial", 0, render_profile="pretty")


def test_init_state_out_of_range():
    with pytest.raises(le.LiberoError, match=r"init state 50 is out of range .* 0\.\.49"):
        le.make_env("libero_spatial", 0, init_state=50, cameras=False)


def test_no_gl_backend_names_the_debian_packages(monkeypatch):
    monkeypatch.setattr(le, "_GL_CHOICE", None)
    monkeypatch.setenv(le.GL_BACKENDS_ENV, "egl,osmesa")
    monkeypatch.setattr(le, "probe_gl", lambda b: (False, "cannot load lib"))
    with pytest.raises(le.GLBackendError, match="libosmesa6") as err:
        le.detect_gl_backend(force=True)
    assert "apt-get install" in str(err.value) and "egl: cannot load lib" in str(err.value)
    monkeypatch.setenv(le.GL_BACKENDS_ENV, "none")
    with pytest.raises(le.GLBackendError, match="libegl1"):
        le.detect_gl_backend(force=True)


def test_libero_config_is_prewritten(tmp_path, monkeypatch):
    monkeypatch.setenv("LIBERO_CONFIG_PATH", str(tmp_path / "cfg"))
    cfg = le.ensure_libero_config()
    text = cfg.read_text()
    assert "bddl_files" in text and "init_states" in text and "assets" in text


@pytest.mark.libero
@pytest.mark.slow
@pytest.mark.parametrize("high", [21, 60_000, 2**40])  # grid cells, a mesh's vertices, too large to pack
def test_unique_rows_groups_orders_and_indexes_as_numpy_does(high):
    rows = np.random.default_rng(0).integers(0, high, size=(5000, 3))
    rows[::7] = rows[3]  # repeats
    for kw in ({"return_inverse": True}, {"return_index": True}):
        want, got = np.unique(rows, axis=0, **kw), le._unique_rows(rows, **kw)
        np.testing.assert_array_equal(got[1].reshape(-1), want[1].reshape(-1))
        assert len(got[0]) == len(want[0])


def test_headless_env_and_privileged_observation():
    from openpi_client import msgpack_numpy

    env = le.make_env("libero_spatial", 0, init_state=1, cameras=False)
    try:
        assert env.num_init_states == 50 and env.objects_of_interest == ["akita_black_bowl_1", "plate_1"]
        assert env.task_language.startswith("pick up the black bowl between the plate")
        obs, reward, done, info = env.step(le.SETTLE_ACTION)
        assert le.state_vector(obs).shape == (8,)
        p = env.privileged_observation()
        assert p["object_names"][p["object_names"].index("plate_1")] == "plate_1"
        assert p["geom_aabb"].shape[1] == 6 and p["eef_mat"].shape == (3, 3)
        back = msgpack_numpy.unpackb(msgpack_numpy.packb(p))
        np.testing.assert_allclose(back["object_pos"], p["object_pos"])
        assert not env.check_success()
        with pytest.raises(le.LiberoError, match="headless"):
            env.images(obs)
        # the expert's obstacle boxes, all geoms at once: the same bits as one geom at a time
        e = env._env.env
        m, d = e.sim.model._model, e.sim.data._data
        rng = np.random.default_rng(0)
        for _ in range(12):
            env.step(np.concatenate([rng.uniform(-0.5, 0.5, 6), [-1.0]]))
            for centre in (p["object_pos"][0], np.array(d.xpos[rng.integers(1, m.nbody)])):
                boxes, owners = le._nearby_geoms(e, m, d, centre, 0.25, "akita_black_bowl_1")
                want, want_owners = _nearby_geoms_one_by_one(e, m, d, centre, 0.25, "akita_black_bowl_1")
                assert owners == want_owners and np.array_equal(boxes, want)
        assert le._collision_geoms(e, m, "akita_black_bowl_1")[0] is le._collision_geoms(e, m, "akita_black_bowl_1")[0]
    finally:
        env.close()


def _nearby_geoms_one_by_one(env, m, d, centre, near, exclude):
    """The per-geom arithmetic :func:`le._nearby_geoms` replaced (its candidates, then each geom's box)."""
    boxes, owners = [], []
    for g, name in zip(*le._collision_geoms(env, m, exclude)):
        R = np.array(d.geom_xmat[g]).reshape(3, 3)
        c = np.array(d.geom_xpos[g]) + R @ m.geom_aabb[g][:3]
        h = np.abs(R) @ m.geom_aabb[g][3:]
        if np.linalg.norm(c[:2] - centre[:2]) - np.linalg.norm(h[:2]) <= near:
            boxes.append(np.concatenate([c, h]))
            owners.append(name)
    return np.array(boxes, dtype=np.float64).reshape(-1, 6), owners


@pytest.mark.libero
@pytest.mark.slow
def test_rendering_env_fast_profile_images():
    env = le.make_env("libero_spatial", 0, image_size=64, render_profile="fast")
    try:
        obs, *_ = env.step(le.SETTLE_ACTION)
        primary, wrist = env.images(obs)
        assert primary.shape == wrist.shape == (64, 64, 3) and primary.dtype == np.uint8
        assert (primary == obs["agentview_image"][::-1, ::-1]).all()
        assert primary.std() > 5  # a real picture, not a blank buffer
        ctx = env.sim._render_context_offscreen
        assert ctx.con.offWidth == 64 and env.sim.model._model.vis.quality.shadowsize == 0
        # simplified visual meshes leave physics alone: same actions, same state as headless
        headless = le.make_env("libero_spatial", 0, cameras=False)
        try:
            env.reset()
            headless.reset()
            for _ in range(5):
                a = le.SETTLE_ACTION.copy()
                a[1] = 0.5
                o1, *_ = env.step(a)
                o2, *_ = headless.step(a)
            np.testing.assert_array_equal(o1["robot0_eef_pos"], o2["robot0_eef_pos"])
        finally:
            headless.close()
    finally:
        env.close()
