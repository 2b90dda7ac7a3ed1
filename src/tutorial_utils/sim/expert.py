"""A scripted pick-and-place expert for libero_spatial, working only from privileged state.

It reads the dicts of :meth:`tutorial_utils.libero_env.LiberoEnv.privileged_observation`
(plain numpy arrays and strings, so the expert can also run behind the websocket policy
server) and returns robosuite actions ``(7,)`` (gripper ``-1`` open, ``+1`` close).

The controller, phase by phase (``ScriptedExpert.phase``):

``settle``    wait until the bowl stops moving (init states drop objects from a few cm);
``plan``      rank rim grasps: points ``RIM_RADIUS`` from the bowl's centre and ``RIM_HEIGHT``
              up its own axis (a bowl can rest tilted), scored by clearance of the fingers
              and hand against nearby geometry and by reach from the robot base;
``approach``  move above the grasp point with the gripper yawed so the fingers close across
              the rim wall; ``descend`` to it; ``close`` the gripper;
``lift``      raise; a finger gap near zero (closed on nothing) or a bowl that does not rise
              is a missed grasp: open, rise and try the next-ranked grasp (``retry``);
``transfer``  carry, steered by where the bowl actually is, until it is over the plate;
``lower``     put it down; ``release``; ``retreat`` up. A bowl dropped on the way is re-planned.

Position commands are proportional (1.0 = 5 cm a step) and saturated per phase; orientation
is held actively with a small proportional rotation command (zero rotation deltas drift).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

RIM_RADIUS = 0.047  # m from the bowl's centre to its rim
RIM_HEIGHT = 0.035  # m up the bowl's axis from its body origin
N_CANDIDATES = 16
REACH_SOFT = 0.70  # top-down reach degrades past this horizontal distance from the base (m)
POS_SCALE = 0.05  # an action of 1.0 moves 5 cm
ROT_SCALE = 0.5  # an action of 1.0 rotates 0.5 rad
GAP_EMPTY = 0.004  # finger gap (m) below which the gripper closed on nothing (~0.0023 empty, ~0.009 on a rim)
MAX_RETRIES = 3
PHASES = ("settle", "plan", "approach", "descend", "close", "lift", "transfer", "lower", "release", "retreat", "retry")


def quat_to_mat(q: np.ndarray) -> np.ndarray:
    """(x, y, z, w) quaternion -> rotation matrix."""
    x, y, z, w = (float(v) for v in q)
    n = x * x + y * y + z * z + w * w
    s = 2.0 / n if n > 0 else 0.0
    return np.array(
        [
            [1 - s * (y * y + z * z), s * (x * y - z * w), s * (x * z + y * w)],
            [s * (x * y + z * w), 1 - s * (x * x + z * z), s * (y * z - x * w)],
            [s * (x * z - y * w), s * (y * z + x * w), 1 - s * (x * x + y * y)],
        ]
    )


def rot_z(theta: float) -> np.ndarray:
    c, s = math.cos(theta), math.sin(theta)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def rotation_error(R_des: np.ndarray, R_cur: np.ndarray) -> np.ndarray:
    """World-frame axis-angle vector that rotates ``R_cur`` onto ``R_des``."""
    R = R_des @ R_cur.T
    cos = np.clip((np.trace(R) - 1.0) / 2.0, -1.0, 1.0)
    angle = math.acos(cos)
    if angle < 1e-6:
        return np.zeros(3)
    v = np.array([R[2, 1] - R[1, 2], R[0, 2] - R[2, 0], R[1, 0] - R[0, 1]])
    s = math.sin(angle)
    if s < 1e-6:  # ~180 degrees: pick the axis from the diagonal
        axis = np.sqrt(np.clip((np.diag(R) + 1.0) / 2.0, 0, None))
        return axis * angle
    return v / (2.0 * s) * angle


def _wrap_half(theta: float) -> float:
    """Wrap to [-pi/2, pi/2): a parallel gripper is symmetric under a half turn."""
    return (theta + math.pi / 2) % math.pi - math.pi / 2


def box_distance(points: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Distance from each point (P, 3) to each axis-aligned box (B, 6: centre, half size) -> (P, B)."""
    if len(boxes) == 0:
        return np.full((len(points), 1), np.inf)
    d = np.abs(points[:, None, :] - boxes[None, :, :3]) - boxes[None, :, 3:]
    return np.linalg.norm(np.clip(d, 0, None), axis=-1)


@dataclass
class Grasp:
    direction: np.ndarray  # unit vector from the bowl's centre to the rim point
    point: np.ndarray  # where the fingertips go
    yaw: float  # gripper yaw change from the start orientation (rad)
    clearance: float
    reach: float
    score: float


def rank_grasps(priv: dict, pick: str, closing_axis0: np.ndarray, n: int = N_CANDIDATES) -> list[Grasp]:
    """Rim grasps of ``pick`` best first, by clearance against ``geom_aabb`` and by reach."""
    names = list(priv["object_names"])
    i = names.index(pick)
    centre = np.asarray(priv["object_pos"][i], dtype=float)
    up = quat_to_mat(priv["object_quat"][i])[:, 2]
    e1 = np.cross(up, [0.0, 1.0, 0.0])
    if np.linalg.norm(e1) < 1e-6:
        e1 = np.cross(up, [1.0, 0.0, 0.0])
    e1 /= np.linalg.norm(e1)
    e2 = np.cross(up, e1)
    boxes = np.asarray(priv["geom_aabb"], dtype=float).reshape(-1, 6)
    base = np.asarray(priv.get("robot_base", [-0.66, 0.0, 0.912]), dtype=float)
    c0 = math.atan2(closing_axis0[1], closing_axis0[0])
    out = []
    for k in range(n):
        phi = 2 * math.pi * k / n
        d = math.cos(phi) * e1 + math.sin(phi) * e2
        point = centre + RIM_RADIUS * d + RIM_HEIGHT * up
        dh = np.array([d[0], d[1], 0.0])
        dh /= max(np.linalg.norm(dh), 1e-9)
        perp = np.array([-dh[1], dh[0], 0.0])
        yaw = _wrap_half(math.atan2(dh[1], dh[0]) - c0)
        # the fingers straddle the rim along dh; the hand sits above them and is wider along dh
        pts = [
            point + s * dh + t * perp + z * np.array([0, 0, 1.0])
            for s in (-0.045, 0.0, 0.045)
            for t in (-0.01, 0.01)
            for z in (-0.012, 0.02, 0.05)
        ]
        pts += [
            point + s * dh + t * perp + z * np.array([0, 0, 1.0])
            for s in (-0.1, -0.05, 0.0, 0.05, 0.1)
            for t in (-0.03, 0.03)
            for z in (0.07, 0.12)
        ]
        clearance = float(box_distance(np.array(pts), boxes).min()) if len(boxes) else 0.1
        reach = float(np.linalg.norm(point[:2] - base[:2]))
        score = (
            min(clearance, 0.03)
            - 0.5 * max(0.0, reach - REACH_SOFT)
            - 0.015 * abs(yaw)
            - (0.05 if abs(yaw) > 1.3 else 0.0)
        )
        score -= 0.02 * max(0.0, -d[2])  # a rim point below the centre (tilted bowl) is awkward
        out.append(Grasp(d, point, yaw, clearance, reach, score))
    out.sort(key=lambda g: -g.score)
    return out


@dataclass
class ScriptedExpert:
    """Closed-loop pick-and-place expert. ``reset(task_info, attempt)`` then ``act(priv)`` per step."""

    pick: str = "akita_black_bowl_1"
    place: str = "plate_1"
    attempt: int = 0
    phase: str = "settle"
    grasps: list = field(default_factory=list)
    log: list = field(default_factory=list)  # (step, phase) per act call

    def reset(self, task_info: dict | Any | None = None, attempt: int = 0) -> None:
        info = task_info.to_dict() if hasattr(task_info, "to_dict") else dict(task_info or {})
        ooi = list(info.get("objects_of_interest") or [])
        if len(ooi) >= 2:
            self.pick, self.place = ooi[0], ooi[1]
        self.attempt = int(attempt)
        self.phase = "settle"
        self.grasps = []
        self.log = []
        self._t = 0
        self._phase_t = 0
        self._prev_pick = None
        self._still = 0
        self._R0 = None
        self._closing0 = None
        self._grasp_idx = 0
        self._retries = 0
        self._grip = -1.0
        self._target = None
        self._R_des = None
        self._hold = None  # (bowl - eef) offset at grasp time
        self._lift_from = None
        self._last_eef = None
        self._stall = 0
        self._grasp_bowl = None
        self._prev_gap = None
        self._retry_z = 0.0

    # --- helpers ---------------------------------------------------------------------------
    def _obj(self, priv: dict, name: str) -> np.ndarray:
        names = list(priv["object_names"])
        if name not in names:
            raise KeyError(f"privileged observation has no object {name!r} (objects: {names})")
        return np.asarray(priv["object_pos"][names.index(name)], dtype=float)

    def _set_phase(self, phase: str) -> None:
        self.phase, self._phase_t, self._stall = phase, 0, 0

    def _move(self, priv: dict, target: np.ndarray, vmax: float, gain: float = 1.0) -> np.ndarray:
        eef = np.asarray(priv["eef_pos"], dtype=float)
        dpos = np.clip(gain * (target - eef) / POS_SCALE, -vmax, vmax)
        R = np.asarray(priv["eef_mat"], dtype=float).reshape(3, 3)
        drot = np.clip(rotation_error(self._R_des, R) / ROT_SCALE * 1.5, -0.4, 0.4)
        return np.concatenate([dpos, drot, [self._grip]])

    def _pos_err(self, priv: dict, target: np.ndarray) -> float:
        return float(np.linalg.norm(target - np.asarray(priv["eef_pos"], dtype=float)))

    def _rot_err(self, priv: dict) -> float:
        return float(np.linalg.norm(rotation_error(self._R_des, np.asarray(priv["eef_mat"]).reshape(3, 3))))

    def _gap(self, priv: dict) -> float:
        q = np.asarray(priv["gripper_qpos"], dtype=float)
        return float(q[0] - q[1])

    def _stalled(self, priv: dict, eps: float = 0.0015, n: int = 4) -> bool:
        eef = np.asarray(priv["eef_pos"], dtype=float)
        if self._last_eef is not None and np.linalg.norm(eef - self._last_eef) < eps:
            self._stall += 1
        else:
            self._stall = 0
        return self._stall >= n

    def _plan(self, priv: dict) -> None:
        ranked = rank_grasps(priv, self.pick, self._closing0)
        k = (self.attempt + self._grasp_idx) % len(ranked)
        self.grasps = ranked[k:] + ranked[:k]
        g = self.grasps[0]
        self._R_des = rot_z(g.yaw) @ self._R0
        self._set_phase("approach")

    # --- the policy -------------------------------------------------------------------------
    def act(self, priv: dict) -> np.ndarray:
        a = self._act(priv)
        self._last_eef = np.asarray(priv["eef_pos"], dtype=float).copy()
        self.log.append((self._t, self.phase))
        self._t += 1
        self._phase_t += 1
        return np.asarray(a, dtype=np.float64)

    def _act(self, priv: dict) -> np.ndarray:
        R = np.asarray(priv["eef_mat"], dtype=float).reshape(3, 3)
        if self._R0 is None:
            # hold the start orientation (pointing down); the fingers close along the eef axis
            # that is most horizontal-y at the start (world y, FACTS section 9)
            self._R0 = R.copy()
            self._R_des = R.copy()
            k = int(np.argmax(np.abs(R[1, :])))
            self._closing0 = R[:, k].copy()
        eef = np.asarray(priv["eef_pos"], dtype=float)
        bowl = self._obj(priv, self.pick)
        plate = self._obj(priv, self.place)

        if priv.get("success") and self.phase not in ("release", "retreat"):
            self._set_phase("retreat")

        if self.phase == "settle":
            moving = self._prev_pick is not None and np.linalg.norm(bowl - self._prev_pick) > 5e-4
            self._prev_pick = bowl.copy()
            self._still = 0 if moving else self._still + 1
            if self._still >= 2 or self._phase_t >= 25:
                self._plan(priv)
                return self._act_phase(priv, eef, bowl, plate)
            return np.array([0, 0, 0, 0, 0, 0, -1.0])
        return self._act_phase(priv, eef, bowl, plate)

    def _act_phase(self, priv, eef, bowl, plate) -> np.ndarray:
        g = self.grasps[0] if self.grasps else None
        if self.phase == "approach":
            self._grip = -1.0
            above = g.point + np.array([0, 0, 0.09])
            # rise first if below the approach height and far away horizontally
            tgt = above.copy()
            if np.linalg.norm(eef[:2] - above[:2]) > 0.04 and eef[2] < above[2] - 0.02:
                tgt = np.array([eef[0], eef[1], above[2]])
            stalled = self._stalled(priv, eps=0.001, n=5)
            close = self._pos_err(priv, above) < 0.012 and self._rot_err(priv) < 0.06
            if close or (stalled and self._pos_err(priv, above) < 0.03 and self._rot_err(priv) < 0.15):
                self._set_phase("descend")
                return self._act_phase(priv, eef, bowl, plate)
            if self._phase_t > 60 or (stalled and self._phase_t > 30):
                return self._retry(priv, eef, bowl, plate)
            return self._move(priv, tgt, vmax=1.0, gain=1.2)
        if self.phase == "descend":
            # the grasp point follows the bowl if it was nudged
            tgt = g.point + (bowl - self._grasp_bowl) if self._grasp_bowl is not None else g.point
            if self._phase_t == 0:
                self._grasp_bowl = bowl.copy()
                tgt = g.point
            stalled = self._stalled(priv)
            if self._pos_err(priv, tgt) < 0.006 or (stalled and self._pos_err(priv, tgt) < 0.02) or self._phase_t > 40:
                self._set_phase("close")
                return self._act_phase(priv, eef, bowl, plate)
            return self._move(priv, tgt, vmax=0.8, gain=1.5)
        if self.phase == "close":
            self._grip = 1.0
            if self._phase_t == 0:
                self._prev_gap = None
            gap = self._gap(priv)
            settled = self._prev_gap is not None and abs(self._prev_gap - gap) < 3e-4
            self._prev_gap = gap
            if (self._phase_t >= 8 and settled) or self._phase_t >= 16:
                if gap < GAP_EMPTY:
                    return self._retry(priv, eef, bowl, plate)
                self._hold = bowl - eef
                self._lift_from = (eef.copy(), bowl.copy())
                self._set_phase("lift")
            return self._move(priv, eef, vmax=0.2)
        if self.phase == "lift":
            e0, b0 = self._lift_from
            z = max(e0[2] + 0.12, plate[2] + 0.24)
            tgt = np.array([e0[0], e0[1], z])
            if self._gap(priv) < GAP_EMPTY:
                return self._retry(priv, eef, bowl, plate)
            if eef[2] - e0[2] > 0.05 and bowl[2] - b0[2] < 0.025:
                return self._retry(priv, eef, bowl, plate)
            if eef[2] > z - 0.015 or self._phase_t > 30:
                self._set_phase("transfer")
                return self._act_phase(priv, eef, bowl, plate)
            return self._move(priv, tgt, vmax=0.3 if self._phase_t < 4 else 1.0)
        if self.phase == "transfer":
            if np.linalg.norm((bowl - eef) - self._hold) > 0.04 or self._gap(priv) < GAP_EMPTY:
                return self._retry(priv, eef, bowl, plate)
            z = max(self._lift_from[0][2] + 0.12, plate[2] + 0.24)
            err = plate[:2] - bowl[:2]
            tgt = np.array([eef[0] + err[0], eef[1] + err[1], z])
            if np.linalg.norm(err) < 0.008 and self._phase_t > 2:
                self._set_phase("lower")
                return self._act_phase(priv, eef, bowl, plate)
            if self._phase_t > 60:
                self._set_phase("lower")
            return self._move(priv, tgt, vmax=1.0, gain=1.0)
        if self.phase == "lower":
            err = plate[:2] - bowl[:2]
            drop = bowl[2] - (plate[2] + 0.025)
            tgt = np.array([eef[0] + err[0], eef[1] + err[1], eef[2] - drop])
            stalled = self._stalled(priv, eps=0.001, n=3)
            if drop < 0.01 or stalled or self._phase_t > 40:
                self._set_phase("release")
                return self._act_phase(priv, eef, bowl, plate)
            return self._move(priv, tgt, vmax=1.0)
        if self.phase == "release":
            self._grip = -1.0
            if self._phase_t >= 6:
                self._set_phase("retreat")
            return self._move(priv, eef, vmax=0.2)
        if self.phase == "retreat":
            self._grip = -1.0
            tgt = np.array([eef[0], eef[1], max(eef[2], plate[2] + 0.2)])
            if not priv.get("success") and self._phase_t > 15 and self._retries < MAX_RETRIES:
                # the bowl is not on the plate: go again from wherever it lies
                self._retries += 1
                self._grasp_idx = 0
                self._set_phase("settle")
                self._prev_pick = None
                self._still = 0
            return self._move(priv, tgt, vmax=0.6)
        if self.phase == "retry":
            self._grip = -1.0
            tgt = np.array([eef[0], eef[1], max(self._retry_z, eef[2])])
            if self._phase_t >= 6 and eef[2] > self._retry_z - 0.02:
                self._set_phase("settle")
                self._prev_pick = None
                self._still = 0
            return self._move(priv, tgt, vmax=0.6)
        raise RuntimeError(f"unknown phase {self.phase!r}")

    def _retry(self, priv, eef, bowl, plate) -> np.ndarray:
        """Missed or dropped grasp: open, rise, then re-plan with the next-ranked grasp."""
        self._retries += 1
        self._grasp_idx += 1
        self._retry_z = eef[2] + 0.08
        self._set_phase("retry" if self._retries <= MAX_RETRIES else "retreat")
        self._grip = -1.0
        return self._move(priv, np.array([eef[0], eef[1], self._retry_z]), vmax=0.5)


# --- running it -------------------------------------------------------------------------------


@dataclass
class EpisodeResult:
    success: bool
    actions: np.ndarray  # (T, 7) robosuite actions after the settle steps, up to success
    phases: list  # phase per action
    steps: int
    attempt: int
    trace: dict = field(default_factory=dict)  # eef/bowl positions per step (for figures)


def run_episode(
    env,
    expert: ScriptedExpert | None = None,
    attempt: int = 0,
    max_steps: int | None = None,
    settle_steps: int | None = None,
    trace: bool = False,
) -> EpisodeResult:
    """Run the expert in ``env`` (a LiberoEnv, usually headless) from its init state.

    The ``NUM_STEPS_WAIT`` settle steps of the evaluation protocol come first (not returned);
    the episode ends at the first step where the task succeeds, or after ``max_steps``.
    """
    from tutorial_utils.sim import libero_env as le

    expert = expert or ScriptedExpert()
    expert.reset(env.info, attempt=attempt)
    env.reset()
    for _ in range(le.NUM_STEPS_WAIT if settle_steps is None else settle_steps):
        env.step(le.SETTLE_ACTION)
    max_steps = env.max_steps if max_steps is None else max_steps
    actions, phases, tr = [], [], {"eef": [], "bowl": [], "gap": []}
    success = False
    for _ in range(max_steps):
        priv = env.privileged_observation()
        a = expert.act(priv)
        if trace:
            tr["eef"].append(priv["eef_pos"].copy())
            tr["bowl"].append(priv["object_pos"][priv["object_names"].index(expert.pick)].copy())
            tr["gap"].append(float(priv["gripper_qpos"][0] - priv["gripper_qpos"][1]))
        actions.append(a)
        phases.append(expert.phase)
        env.step(a)
        if env.check_success():
            success = True
            break
    return EpisodeResult(
        success,
        np.array(actions).reshape(-1, 7),
        phases,
        len(actions),
        attempt,
        {k: np.array(v) for k, v in tr.items()} if trace else {},
    )


def solve(env, attempts: int = 4, max_steps: int | None = None, trace: bool = False) -> EpisodeResult:
    """Search headless for a successful episode: attempt 0 starts with the best-ranked grasp,
    attempt k with the k-th (MuJoCo replays deterministically, so a success is reproducible)."""
    last = None
    for k in range(attempts):
        last = run_episode(env, attempt=k, max_steps=max_steps, trace=trace)
        if last.success:
            return last
    return last


def success_table(
    suite: str = "libero_spatial",
    task_ids=range(10),
    init_states=range(10),
    attempts: int = 4,
    out: str | None = None,
    progress: bool = True,
) -> dict:
    """Solve every (task, init state) headless; per-task successes, first-try successes, steps."""
    import time

    from tutorial_utils.sim import libero_env as le

    rows, t0 = [], time.time()
    for tid in task_ids:
        env = le.make_env(suite, tid, cameras=False)
        try:
            row = {"task_id": tid, "task": env.task_language, "pairs": 0, "success": 0, "first_try": 0, "steps": []}
            for i in init_states:
                env.reset(int(i))
                r = solve(env, attempts=attempts)
                row["pairs"] += 1
                row["success"] += int(r.success)
                row["first_try"] += int(r.success and r.attempt == 0)
                if r.success:
                    row["steps"].append(r.steps)
                if progress:
                    print(
                        f"task {tid} init {i}: {'ok' if r.success else 'FAIL'} attempt {r.attempt} steps {r.steps}",
                        flush=True,
                    )
            row["mean_steps"] = float(np.mean(row["steps"])) if row["steps"] else None
            del row["steps"]
            rows.append(row)
        finally:
            env.close()
    total = sum(r["pairs"] for r in rows)
    ok = sum(r["success"] for r in rows)
    result = {
        "suite": suite,
        "init_states": [int(i) for i in init_states],
        "attempts": attempts,
        "rows": rows,
        "pairs": total,
        "successes": ok,
        "rate": ok / total if total else 0.0,
        "first_try_rate": sum(r["first_try"] for r in rows) / total if total else 0.0,
        "wall_s": round(time.time() - t0, 1),
    }
    if out:
        from tutorial_utils.io import atomic_write_json

        atomic_write_json(out, result)
    return result


def format_table(result: dict) -> str:
    lines = ["| task | language | success | first try | mean steps |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        ms = f"{r['mean_steps']:.0f}" if r["mean_steps"] else "-"
        lines.append(
            f"| {r['task_id']} | {r['task']} | {r['success']}/{r['pairs']} | {r['first_try']}/{r['pairs']} | {ms} |"
        )
    lines.append(
        f"| all | | {result['successes']}/{result['pairs']} ({100 * result['rate']:.1f}%) | "
        f"{100 * result['first_try_rate']:.1f}% | |"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``python -m tutorial_utils.expert [--tasks 0,1] [--inits 0-9] [--attempts 4] [--out logs/expert_success.json]``"""
    import argparse

    p = argparse.ArgumentParser(prog="python -m tutorial_utils.expert", description="expert success table (headless)")
    p.add_argument("--suite", default="libero_spatial")
    p.add_argument("--tasks", default="0-9")
    p.add_argument("--inits", default="0-9")
    p.add_argument("--attempts", type=int, default=4)
    p.add_argument("--out", default="")
    args = p.parse_args(argv)

    def rng(s: str) -> list[int]:
        if "-" in s:
            a, b = s.split("-")
            return list(range(int(a), int(b) + 1))
        return [int(x) for x in s.split(",")]

    res = success_table(args.suite, rng(args.tasks), rng(args.inits), args.attempts, out=args.out or None)
    print(format_table(res))
    return 0 if res["rate"] >= 0.95 else 1


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))


# --- figures -------------------------------------------------------------------------------------

#: Colours of the phases in figures.
PHASE_COLORS = {
    "settle": "#bbbbbb",
    "approach": "#4c72b0",
    "descend": "#55a868",
    "close": "#c44e52",
    "lift": "#8172b2",
    "transfer": "#ccb974",
    "lower": "#64b5cd",
    "release": "#e17c05",
    "retreat": "#999999",
    "retry": "#000000",
    "plan": "#dddddd",
}


def trace_episode(suite: str = "libero_spatial", task_id: int = 0, init_state: int = 0, out: str | None = None) -> dict:
    """Run the expert once headless and return (and optionally save as JSON) its trace:
    phase, eef and bowl position, finger gap and action per step."""
    from tutorial_utils.sim import libero_env as le

    env = le.make_env(suite, task_id, init_state, cameras=False)
    try:
        r = solve(env, trace=True)
        trace = {
            "suite": suite,
            "task_id": task_id,
            "init_state": init_state,
            "task": env.task_language,
            "success": bool(r.success),
            "attempt": int(r.attempt),
            "phases": list(r.phases),
            "eef": r.trace["eef"].round(4).tolist(),
            "bowl": r.trace["bowl"].round(4).tolist(),
            "gap": np.round(r.trace["gap"], 4).tolist(),
            "actions": r.actions.round(3).tolist(),
        }
    finally:
        env.close()
    if out:
        from tutorial_utils.io import atomic_write_json

        atomic_write_json(out, trace, indent=None)
    return trace


def phase_segments(phases: list[str]) -> list[tuple[str, int, int]]:
    """Runs of equal phases as (phase, first step, last step + 1)."""
    segs: list[tuple[str, int, int]] = []
    for i, p in enumerate(phases):
        if segs and segs[-1][0] == p:
            segs[-1] = (p, segs[-1][1], i + 1)
        else:
            segs.append((p, i, i + 1))
    return segs


def plot_phases(trace: dict):
    """A figure of one expert episode: heights of gripper and bowl, finger gap, phases shaded."""
    import matplotlib.pyplot as plt

    eef, bowl, gap = np.array(trace["eef"]), np.array(trace["bowl"]), np.array(trace["gap"])
    t = np.arange(len(eef))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 4.8), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    seen = set()
    for phase, a, b in phase_segments(trace["phases"]):
        for ax in (ax1, ax2):
            ax.axvspan(
                a - 0.5,
                b - 0.5,
                color=PHASE_COLORS.get(phase, "#eeeeee"),
                alpha=0.25,
                lw=0,
                label=phase if (ax is ax1 and phase not in seen) else None,
            )
        seen.add(phase)
    ax1.plot(t, eef[:, 2], color="k", label="gripper z")
    ax1.plot(t, bowl[:, 2], color="#c44e52", lw=2, label="bowl z")
    ax1.set_ylabel("height (m)")
    ax1.legend(loc="upper right", ncol=4, fontsize=8)
    ax1.set_title(f"expert on task {trace['task_id']}, init state {trace['init_state']}: {trace['task']}", fontsize=10)
    ax2.plot(t, gap, color="k")
    ax2.axhline(GAP_EMPTY, color="#c44e52", ls="--", lw=1)
    ax2.text(0, GAP_EMPTY + 0.003, "closed on nothing below this", fontsize=8, color="#c44e52")
    ax2.set_ylabel("finger gap (m)")
    ax2.set_xlabel("control step (20 Hz, after the 10 settle steps)")
    fig.tight_layout()
    return fig
