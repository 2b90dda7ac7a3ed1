"""The zoo's catalogue and its families, read from the families' classes (``catalog``,
``comparison``, ``train_defaults``, ``timing_overrides``): what the platform guide lists, how far each
goes here, which ones the comparison trains."""

from __future__ import annotations

from typing import Any

from tutorial_utils.errors import ConfigError
from tutorial_utils.policies.base import PolicyUnavailable

#: the catalogue's groups, in the order the platform guide presents them
GROUPS = ("vision-language-action", "imitation learning", "policy learning", "reinforcement learning", "this book")


def _families_with(attribute: str) -> list[type]:
    """The registered TrainablePolicy classes (registration order) whose ``attribute`` is set."""
    from tutorial_utils import policies

    out = []
    for name in policies.registered():
        try:
            cls = policies.family(name)
        except PolicyUnavailable:  # a serving-only policy
            continue
        if getattr(cls, attribute, None):
            out.append(cls)
    return out


def comparison_families() -> tuple[str, ...]:
    """The families the comparison trains and evaluates: those whose class sets ``comparison = True``
    (mini, act, diffusion, vqbet), in registration order."""
    return tuple(cls.name for cls in _families_with("comparison"))


def learning_rate(name: str) -> float:
    """The peak learning rate family ``name`` trains with (its recipe's, ``train.config.family_recipe``)."""
    from tutorial_utils.train.config import family_recipe

    return family_recipe(name)["optimizer_lr"]


def timing_overrides(name: str) -> dict[str, Any]:
    """Config overrides only the zoo's step timing uses (the family's ``timing_overrides``)."""
    from tutorial_utils import policies

    return dict(policies.family(name).timing_overrides)


def untimed_steps(name: str) -> int:
    """Training steps of ``name`` that the zoo's timing leaves out (its cheap first phase at the
    family's default config; 0 for a family whose every step is timed)."""
    from tutorial_utils import policies

    return policies.first_phase_steps(name)


def __getattr__(name: str) -> Any:
    if name == "FAMILIES":  # read from the families' classes when asked (it imports them)
        return comparison_families()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def catalog():
    """The families with a catalogue row (their class's ``catalog``) as a pandas DataFrame: group,
    the guide's scenario, how far it goes here, whether the project's trainer trains it, whether
    the comparison includes it and whether it needs a GPU server."""
    import pandas as pd

    from tutorial_utils import policies

    gpu = set(policies.gpu_server())
    classes = _families_with("catalog")
    order = {g: i for i, g in enumerate(GROUPS)}
    classes.sort(key=lambda c: order.get(c.catalog["group"], len(GROUPS)))
    rows = [
        {
            "family": c.name,
            "group": c.catalog["group"],
            "scenario": c.catalog["scenario"],
            "here": c.catalog["here"],
            "trains here": c.name not in gpu and bool(c.trains_here) and not policies.trainer_refusal(c.name),
            "in the comparison": bool(c.comparison),
            "GPU server": c.name in gpu,
        }
        for c in classes
    ]
    return pd.DataFrame(rows).set_index("family")


def parse_families(text: str | None) -> list[str]:
    """``"mini,act"`` -> ``["mini", "act"]``, None -> every family of the comparison. A family
    outside the comparison that the trainer trains (``mlp``, ``tdmpc``: for a positive control) may
    be named; an unknown name, or a family the trainer refuses (SAC, :func:`policies.trainer_refusal`),
    is a clear error."""
    from tutorial_utils import policies

    families = comparison_families()
    if text is None:
        return list(families)
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    if not names:
        raise ConfigError(f"families={text!r}: name at least one of {', '.join(families)}")
    trainable = policies.trainable()
    for n in names:
        if n not in families:
            cls = policies.family(n) if n in trainable else None
            if cls is not None and not policies.trainer_refusal(n):
                continue  # the trainer trains it, outside the comparison (mlp, tdmpc)
            if cls is not None:
                group = (cls.catalog or {}).get("group")
                other = (
                    f"it is built here{f' ({group})' if group else ''} but not part of the comparison. "
                    f"{getattr(cls, 'what_ran', '')}".strip()
                )
            else:
                other = f"trainable families: {', '.join(trainable)}"
            raise ConfigError(f"families: {n!r} is not in the zoo's comparison ({', '.join(families)}); {other}")
    if len(set(names)) != len(names):
        raise ConfigError(f"families={text!r} names a family twice")
    return names
