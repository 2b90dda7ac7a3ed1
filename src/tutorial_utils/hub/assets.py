"""The assets of the official DiT4DiT chain on the Hub (FACTS section 11), one row each."""

from __future__ import annotations

from dataclasses import dataclass, field

from tutorial_utils.errors import ConfigError


@dataclass(frozen=True)
class Asset:
    """One download: a Hub repo, the revision and files wanted, and the files that must exist."""

    name: str
    repo_id: str
    repo_type: str = "model"  # "model" or "dataset"
    revision: str = "main"
    allow_patterns: tuple[str, ...] | None = None
    gated: bool = False
    key_files: tuple[str, ...] = field(default_factory=tuple)
    about: str = ""

    @property
    def page(self) -> str:
        """The repo's page on the Hub (where a gated licence is accepted)."""
        prefix = "datasets/" if self.repo_type == "dataset" else ""
        return f"https://huggingface.co/{prefix}{self.repo_id}"


#: the four LIBERO suites IPEC-COMMUNITY publishes in LeRobot v2.1 format (a fact about the Hub:
#: LIBERO's own suite list, with libero_90, is ``tutorial_utils.sim.libero_env.SUITES``)
SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10")

_DATASET_KEYS = ("meta/info.json", "meta/episodes.jsonl", "meta/tasks.jsonl")

ASSETS: dict[str, Asset] = {
    "checkpoint": Asset(
        "checkpoint",
        "mondo-robotics/dit4dit-model",
        allow_patterns=("dit4dit_libero/*",),
        key_files=(
            "dit4dit_libero/final_model/pytorch_model.pt",
            "dit4dit_libero/config.yaml",
            "dit4dit_libero/dataset_statistics.json",
        ),
        about="the released DiT4DiT LIBERO checkpoint (only dit4dit_libero/, not the RoboCasa one)",
    ),
    "cosmos": Asset(
        "cosmos",
        "nvidia/Cosmos-Predict2.5-2B",
        revision="diffusers/base/post-trained",
        gated=True,
        key_files=("model_index.json",),
        about="the Cosmos-Predict2.5-2B backbone as a diffusers folder (gated: accept the licence first)",
    ),
    **{
        f"dataset:{suite}": Asset(
            f"dataset:{suite}",
            f"IPEC-COMMUNITY/{suite}_no_noops_1.0.0_lerobot",
            repo_type="dataset",
            key_files=_DATASET_KEYS,
            about=f"the {suite} demonstrations in LeRobot v2.1 format",
        )
        for suite in SUITES
    },
}


def get_asset(name: str | Asset) -> Asset:
    """The asset called ``name`` (``checkpoint``, ``cosmos``, ``dataset:<suite>``)."""
    if isinstance(name, Asset):
        return name
    if name in ASSETS:
        return ASSETS[name]
    if name in SUITES:
        return ASSETS[f"dataset:{name}"]
    raise ConfigError(f"unknown Hub asset {name!r}. Fix: use one of {', '.join(ASSETS)}")
