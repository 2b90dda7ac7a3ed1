"""The policy seam: a family is one module and one register call; training, checkpoints,
serving and evaluation never name it.

``mlp`` (tutorial_utils.policies.mlp) is the proof: the same train job, checkpoint loader,
policy server and LIBERO client as ``mini``. A family defined here, in the test, shows that a
``register`` call is all the rest of the package needs.
"""

from __future__ import annotations

import dataclasses
import os
import signal

import numpy as np
import pytest
import torch
from torch import nn

from helpers import TINY_MLP
from tutorial_utils import params, policies
from tutorial_utils.errors import ConfigError
from tutorial_utils.policies.base import BATCH_ACTION, BATCH_ACTION_IS_PAD, BATCH_KEYS, PolicyUnavailable
from tutorial_utils.policies.trainable import TrainablePolicy
from tutorial_utils.train.config import TrainConfig
from tutorial_utils.train.data import WindowDataset, collate, synthetic_source
from tutorial_utils.train.loop import train


@dataclasses.dataclass
class ConstantConfig:
    action_horizon: int = params.param(4, "chunk length", "model")
    image_size: int = params.param(16, "image size", "model")


class ConstantPolicy(nn.Module, TrainablePolicy):
    """Predicts one learned chunk whatever it sees: the smallest thing the seam accepts."""

    name = "test_constant"
    config_class = ConstantConfig
    catalog = {"group": "this book", "scenario": "a test's family", "here": "trained, saved and served by a test"}

    def __init__(self, cfg=None, statistics=None):
        super().__init__()
        self.cfg = cfg or ConstantConfig()
        self.statistics = dict(statistics or {})
        self.chunk = nn.Parameter(torch.zeros(self.cfg.action_horizon, 7))

    def loss(self, batch, generator=None):  # the seam's default forward calls it
        target = torch.as_tensor(batch[BATCH_ACTION], dtype=torch.float32)
        keep = (~torch.as_tensor(batch[BATCH_ACTION_IS_PAD]))[..., None].float()
        loss = (((self.chunk - target) ** 2) * keep).sum() / keep.sum().clamp_min(1)
        return {"total_loss": loss}

    def predict(self, batch, generator=None):
        n = len(batch["task"])
        return self.chunk.detach().expand(n, -1, -1).numpy().astype(np.float32)


RUN = {
    "batch_size": 4,
    "log_freq": 5,
    "eval_freq": 10,
    "save_freq": 10,
    "num_workers": 0,
    "progress": False,
    "scheduler_warmup_steps": 0,
    "val_fraction": 0.2,
    "val_samples": 8,
    "augment_shift": 0,
}


def test_registry_lists_and_refuses_clearly():
    assert {"mini", "mlp"} <= set(policies.trainable())
    assert {"zero", "expert", "dit4dit"} <= set(policies.available()) - set(policies.trainable())
    with pytest.raises(PolicyUnavailable, match="unknown policy 'nope'.*mini"):
        policies.make("nope")
    with pytest.raises(PolicyUnavailable, match="served but not trained"):
        policies.make("expert")
    with pytest.raises(ConfigError, match="unknown parameter 'hiden_dim'.*hidden_dim"):
        policies.make("mlp", {"hiden_dim": 3})


def test_training_config_routes_family_parameters():
    cfg = TrainConfig.from_overrides({"policy": "mlp", "hidden_dim": "32", "policy.pool": 2, "steps": 3})
    assert cfg.policy_config.hidden_dim == 32 and cfg.policy_config.pool == 2 and cfg.steps == 3
    with pytest.raises(ConfigError, match="unknown parameter 'model_dim'"):  # a mini field is not an mlp field
        TrainConfig.from_overrides({"policy": "mlp", "model_dim": 64})
    with pytest.raises(ConfigError, match="expected int"):
        TrainConfig.from_overrides({"steps": 2.5})


def test_a_family_registered_in_a_test_joins_the_catalogue_and_is_removed_afterwards(registry):
    """One class and one ``register`` line: the zoo's catalogue lists it (its ``catalog`` row),
    the catalogue's own test accepts it, the train CLI lists its parameters, and its train
    defaults come from the seam (nothing frozen). The fixture removes it afterwards."""
    from helpers import check_catalog_matches_registry
    from tutorial_utils.experiments import catalog
    from tutorial_utils.train.cli import main

    registry.register(ConstantPolicy.name, ConstantPolicy)
    cat = catalog.catalog()
    assert cat.loc["test_constant", "trains here"] and not cat.loc["test_constant", "in the comparison"]
    check_catalog_matches_registry()
    assert "test_constant" not in catalog.comparison_families()
    assert main(["--list-params", "policy=test_constant"]) == 0
    assert TrainConfig.from_overrides({"policy": "test_constant"}).freeze_list == []


def test_the_registry_fixture_restores_the_registry(registry):
    assert ConstantPolicy.name not in policies.available()  # the test above registered it under the fixture


def test_a_family_registered_in_a_test_trains_saves_and_serves(tmp_path, registry):
    policies.register(ConstantPolicy.name, ConstantPolicy)
    src = synthetic_source(n_episodes=5, length=12, image_size=16)
    cfg = TrainConfig.from_overrides(
        {**RUN, "policy": ConstantPolicy.name, "steps": 20, "optimizer_lr": 0.05, "output_dir": str(tmp_path / "run")}
    )
    res = train(cfg, source=src)
    assert res.steps_done == 20 and res.summary["policy"] == ConstantPolicy.name
    assert res.losses[-1][1] < res.losses[0][1]
    last = tmp_path / "run" / "checkpoints" / "last"
    model = policies.load(last)
    assert isinstance(model, ConstantPolicy)
    served = policies.make_policy(ConstantPolicy.name, checkpoint=str(last))
    obs = {
        "observation/image": np.zeros((16, 16, 3), np.uint8),
        "observation/wrist_image": np.zeros((16, 16, 3), np.uint8),
        "observation/state": np.zeros(8, np.float32),
        "prompt": "x",
    }
    assert served.infer(obs)["actions"].shape == (4, 7)
    assert served.metadata["policy"] == ConstantPolicy.name and served.metadata["image_size"] == 16


def test_batches_use_lerobot_keys():
    src = synthetic_source(n_episodes=2, length=6, image_size=16)
    b = collate([WindowDataset(src, np.arange(len(src)), 8, 16)[i] for i in (0, 5)])
    assert set(b) == set(BATCH_KEYS)
    assert b["observation.images.image"].shape == (2, 16, 16, 3) and b["action"].shape == (2, 8, 7)
    assert b["action_is_pad"][1].tolist() == [False] + [True] * 7  # frame 5 is its episode's last


def test_mlp_trains_through_the_same_loop_and_resumes_exactly(tmp_path):
    src = synthetic_source(n_episodes=5, length=12, image_size=16)
    base = {**RUN, **TINY_MLP, "policy": "mlp", "steps": 20, "optimizer_lr": 3e-3}
    full = train(TrainConfig.from_overrides({**base, "output_dir": str(tmp_path / "a")}), source=src)

    def stop_at_10(step, loss):
        if step == 10:
            os.kill(os.getpid(), signal.SIGTERM)  # the loop finishes the step, saves and stops

    half = train(
        TrainConfig.from_overrides({**base, "output_dir": str(tmp_path / "b")}), source=src, on_step=stop_at_10
    )
    rest = train(TrainConfig.from_overrides({**base, "resume": True, "output_dir": str(tmp_path / "b")}), source=src)
    assert half.stopped_by == "SIGTERM" and half.steps_done == 10 and rest.steps_done == 20
    assert half.losses + rest.losses == full.losses  # bit-identical
    assert full.losses[-1][1] < full.losses[0][1]
    assert full.summary["best"]["val_action_mae"] is not None


@pytest.mark.libero
@pytest.mark.slow
def test_mlp_end_to_end_train_job_serve_and_one_libero_episode(tmp_path):
    """The worked example of CONTRIBUTING.md: the train job (20 steps on a recorded-schema
    dataset), its checkpoint served by `python -m tutorial_utils serve --policy mlp` in its own
    process, and one real LIBERO episode driven by the evaluation job's client process."""
    from tutorial_utils import jobs
    from tutorial_utils.evaluate import chain
    from tutorial_utils.train import job

    run = tmp_path / "train"
    res = job.run_job(run, dataset="synthetic", policy="mlp", steps=20, **{k: v for k, v in RUN.items()}, **TINY_MLP)
    assert res.steps_done == 20
    status = jobs.read_status(run)
    assert all(status["success_signs"].values()) and status["train"]["policy"] == "mlp"
    ckpt = status["train"]["last_checkpoint"]
    out = chain.run_job(
        tmp_path / "eval",
        policy="mlp",
        checkpoint=ckpt,
        task_ids="0",
        max_steps=16,
        videos=False,
        server_timeout=120,
        client_timeout=600,
    )
    assert out.diagnosis.ok, out.diagnosis
    assert out.results["finished"] and out.results["total_episodes"] == 1
    meta = out.results["policy"]  # what the server announced: actions already in the env convention
    assert meta["policy"] == "mlp" and meta["gripper"] == "robosuite" and meta["policy_gripper"] == "dataset"
    assert out.results["tasks"][0]["episodes"][0]["steps"] == 16  # an untrained baseline does not solve it


def test_job_clis_are_generated_from_their_configs(capsys):
    from tutorial_utils.evaluate.loop import EvalConfig
    from tutorial_utils.sim.record import RecordConfig

    for cls in (EvalConfig, RecordConfig):
        assert params.parse_cli(cls, ["--list-params"], "prog", "d") is None
        table = capsys.readouterr().out
        assert all(f"`{f.name}`" in table for f in dataclasses.fields(cls))
    cfg = params.parse_cli(EvalConfig, ["--task-ids", "0-2", "--max-steps", "none", "--videos", "false"], "p", "d")
    assert cfg.task_list == [0, 1, 2] and cfg.max_steps is None and cfg.videos is False
    with pytest.raises(SystemExit) as exit_info:
        params.parse_cli(RecordConfig, ["--episodes-per-task", "2.5"], "p", "d")
    assert exit_info.value.code == 2 and "episodes_per_task='2.5': expected int" in capsys.readouterr().err


def test_the_eval_client_reads_its_config_from_the_json_the_chain_writes(tmp_path):
    from tutorial_utils.evaluate.loop import EvalConfig

    cfg = EvalConfig(policy="mini", task_ids="3", port=1234, max_steps=12, replan_steps=None)
    params.write_json(cfg, tmp_path / "client_config.json")
    back = params.parse_cli(EvalConfig, ["--config", str(tmp_path / "client_config.json"), "--seed", "9"], "p", "d")
    assert back == dataclasses.replace(cfg, seed=9)


class SGDConstantPolicy(ConstantPolicy):
    """The same family choosing its own optimiser through the seam (no trainer change)."""

    name = "test_sgd_constant"
    chosen: list = []

    def optimizer(self, cfg):
        opt = torch.optim.SGD(self.parameter_groups(cfg), lr=cfg.optimizer_lr)
        SGDConstantPolicy.chosen.append(type(opt).__name__)
        return opt


def test_a_family_chooses_its_optimizer(tmp_path, registry):
    registry.register(SGDConstantPolicy.name, SGDConstantPolicy)
    src = synthetic_source(n_episodes=4, length=10, image_size=16)
    cfg = TrainConfig.from_overrides(
        {**RUN, "policy": SGDConstantPolicy.name, "steps": 10, "optimizer_lr": 0.1, "output_dir": str(tmp_path / "r")}
    )
    res = train(cfg, source=src)
    assert SGDConstantPolicy.chosen == ["SGD"] and res.steps_done == 10
    assert policies.load(tmp_path / "r" / "checkpoints" / "last").chunk.abs().sum() > 0  # SGD moved the weights


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mlp", "act"])
def test_the_train_job_runs_every_family_in_the_ci_profile(family, runs_dir, monkeypatch):
    """The job's ci defaults once froze `backbone`, which only mini has: family-specific defaults
    (``freeze_modules``) now come from the family, so ``-p policy <family>`` runs as it is."""
    from tutorial_utils import jobs, paths

    monkeypatch.setenv("TUTORIAL_PROFILE", "ci")
    extra = {"chunk_size": 4, "n_action_steps": 4, "dim_model": 32, "n_encoder_layers": 1} if family == "act" else {}
    res = jobs.run_notebook(paths.JOBS / "train.md", {"policy": family, **extra}, runs_dir / "t")
    status = jobs.read_status(res.run_dir)
    assert all(status["success_signs"].values()) and status["train"]["steps_done"] == 2
