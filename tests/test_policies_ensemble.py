"""Temporal ensembling (policies/ensemble.py) and the served model that uses it: the running
average equals the weighted average of every stored prediction, one action per request, a new
episode forgets the old one, and only trained families accept it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers import openpi_observation
from tutorial_utils.errors import ConfigError
from tutorial_utils.policies.base import BATCH_STATE, EPISODE_KEY, STATE_KEY
from tutorial_utils.policies.ensemble import TemporalEnsembler
from tutorial_utils.policies.trainable import ServedModel


def brute_force(chunks: list[np.ndarray], coeff: float) -> np.ndarray:
    """The action for the last step: every chunk that covers it, the oldest weighing exp(0)."""
    t, h = len(chunks) - 1, chunks[0].shape[0]
    covering = [(s, chunks[s][t - s]) for s in range(len(chunks)) if 0 <= t - s < h]  # oldest first
    w = np.exp(-coeff * np.arange(len(covering)))
    return sum(wi * a for wi, (_, a) in zip(w, covering, strict=True)) / w.sum()


@pytest.mark.parametrize("coeff", [0.01, 0.5, -0.3, 0.0])
def test_the_running_average_is_the_weighted_average_of_every_prediction(coeff):
    rng = np.random.default_rng(0)
    ens, chunks = TemporalEnsembler(coeff, chunk_size=5), []
    for _ in range(12):
        chunks.append(rng.normal(size=(5, 7)))
        np.testing.assert_allclose(ens.update(chunks[-1]), brute_force(chunks, coeff), rtol=1e-5, atol=1e-6)
    ens.reset()  # a new episode: the first action is the new chunk's own
    fresh = rng.normal(size=(5, 7))
    np.testing.assert_allclose(ens.update(fresh), fresh[0], rtol=1e-6)


def test_bad_ensembler_input_is_refused():
    with pytest.raises(ValueError, match="finite"):
        TemporalEnsembler(math.nan, 4)
    with pytest.raises(ValueError, match=r"\(4, action_dim\)"):
        TemporalEnsembler(0.01, 4).update(np.zeros((3, 7)))


class StepModel:
    """A chunk model whose chunk k-th action is state + k (so each step's predictions differ)."""

    name, gripper, action_horizon, image_size, n_obs_steps = "steps", "dataset", 4, 8, 1

    def predict(self, batch, generator=None):
        x = float(np.asarray(batch[BATCH_STATE]).reshape(-1)[0])
        chunk = np.zeros((1, 4, 7), np.float32)
        chunk[0, :, 0] = x + np.arange(4)
        return chunk


def _obs(x: float, episode: str) -> dict:
    obs = openpi_observation(8)
    obs[STATE_KEY] = np.full(8, x, np.float32)
    obs[EPISODE_KEY] = episode
    return obs


def test_a_served_model_with_ensembling_answers_one_averaged_action_per_step():
    served = ServedModel(StepModel(), temporal_ensemble=0.0)  # 0: a plain average
    assert served.metadata["replan_steps"] == 1 and served.metadata["temporal_ensemble"] == 0.0
    # step 0 predicts [0,1,2,3]; step 1 (state 5) predicts [5,6,7,8]: step 1's action = mean(1, 5)
    assert served.infer(_obs(0, "a"))["actions"].shape == (1, 7)
    assert served.infer(_obs(5, "a"))["actions"][0, 0] == pytest.approx(3.0)
    # a new episode starts from its own chunk
    assert served.infer(_obs(5, "b"))["actions"][0, 0] == pytest.approx(5.0)
    plain = ServedModel(StepModel())
    assert plain.metadata["replan_steps"] == 4 and "temporal_ensemble" not in plain.metadata
    assert plain.infer(_obs(0, "a"))["actions"].shape == (4, 7)


def test_only_trained_families_accept_ensembling():
    from tutorial_utils import policies
    from tutorial_utils.serve.config import ServeConfig

    with pytest.raises(ConfigError, match="temporal_ensemble_coeff applies to a trained family"):
        policies.make_policy("zero", temporal_ensemble=0.01)
    with pytest.raises(ConfigError, match="temporal_ensemble_coeff=inf"):
        ServeConfig(temporal_ensemble_coeff=math.inf).check()
