"""Make ``import torchvision`` work beside this project's CPU torch, and do nothing elsewhere.

PyPI's torchvision wheel (0.28.0 for torch 2.13.0) is a CUDA build. Beside the local CPU torch
its C++ op library does not load, which torchvision tolerates (``extension._has_ops()`` is then
False), but ``torchvision/_meta_registrations.py`` still registers fake kernels for the
``torchvision::nms`` and ``torchvision::qnms`` operators unconditionally, and that raises
``RuntimeError: operator torchvision::nms does not exist``. Defining the two operator schemas
first (without kernels) lets those registrations succeed, so the pure-Python parts (models,
transforms: what LeRobot's ACT, Diffusion and VQ-BeT use) import. Calling ``nms`` itself would
still fail; no policy here does.

:func:`ensure_importable` tries the plain import first and only defines the schemas when the import
failed with exactly that error; where torchvision imports normally (a matching CPU or CUDA build)
it returns False and changes nothing.
"""

from __future__ import annotations

import re
import sys

#: the operator schemas ``_meta_registrations`` expects (as torchvision's C++ library defines them)
SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_MISSING_OP = re.compile(r"operator torchvision::(\w+) does not exist")

#: the torch.library fragment holding the schemas (kept alive: dropping it unregisters them)
_FRAGMENT = None


def _forget_partial_import() -> None:
    for name in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
        del sys.modules[name]


def ensure_importable() -> bool:
    """Import torchvision, defining its missing op schemas only if the import fails for that reason.

    Returns True when the workaround was applied (now or by an earlier call), False when
    torchvision imported on its own. Any other import failure (not installed, another error) is
    raised unchanged.
    """
    global _FRAGMENT
    if _FRAGMENT is not None:
        import torchvision  # noqa: F401  (already made importable by an earlier call)

        return True
    try:
        import torchvision  # noqa: F401

        return False
    except RuntimeError as exc:
        if not _MISSING_OP.search(str(exc)):
            raise
        first_error = exc
    _forget_partial_import()

    import torch

    fragment = torch.library.Library("torchvision", "FRAGMENT")  # noqa: TOR901 - schemas only, no kernels
    for op, schema in SCHEMAS.items():
        if not torch._C._jit_get_schemas_for_operator(f"torchvision::{op}"):
            fragment.define(schema)
    _FRAGMENT = fragment
    try:
        import torchvision  # noqa: F401,F811
    except RuntimeError as exc:
        _forget_partial_import()
        raise RuntimeError(
            f"torchvision does not import beside torch {torch.__version__} even with the "
            f"torchvision::{'/'.join(SCHEMAS)} schemas defined ({exc}; first error: {first_error}). "
            "Install the torchvision release built for this torch (requirements-lerobot04.txt pins it)."
        ) from exc
    return True
