"""Checks shared by the in-process engines: requests that need the checkpoint's catalog (on top of
`base.validate_*`), and the device an engine is asked to run on (before its checkpoint loads)."""

from __future__ import annotations

from workbench.engines.base import BeamSearchRequest, RequestError
from workbench.errors import UsageError


class DeviceError(UsageError, ValueError):
    """A device this machine cannot run on: a CUDA device without CUDA, an index beyond its GPUs, a bad name."""


def require_device(device) -> str:
    """`device` as a string (cpu | cuda | cuda:N) if this machine has it, else DeviceError saying what it has and
    what to use instead (`hardware.device_problem`)."""
    from workbench.hardware import device_problem

    why = device_problem(str(device))
    if why is not None:
        raise DeviceError(why)
    return str(device).strip()


def validate_constraint(r: BeamSearchRequest, catalog) -> None:
    """Constrained search makes one item SID; banned items must be catalog indices."""
    if r.constrained:
        if r.max_new_tokens > catalog.depth:
            raise RequestError(
                f"constrained beam search generates one item SID of {catalog.depth} tokens; "
                f"set max_new_tokens <= {catalog.depth}"
            )
        bad = [i for i in r.banned_items if not 0 <= int(i) < catalog.n_items]
        if bad:
            raise RequestError(f"banned_items outside the catalog [0, {catalog.n_items}): {bad[:5]}")
    elif r.banned_items:
        raise RequestError("banned_items only apply to constrained beam search; set constrained=True")


def validate_projected(row, user_vector, dtype: str) -> None:
    """The projected user vector (`row`, a tensor in the model's dtype) must be finite.

    A vector within the dtype's range (`Limits.max_abs_user_value`) can still overflow in the projector's
    matmul (3e38 in float32 does) or in the cast to bfloat16; an inf/NaN row would turn every log-prob of
    the request into NaN. Checked per request, so only the request that sent the vector fails.
    """
    if not bool(row.isfinite().all()):
        import torch

        peak = max(abs(x) for x in user_vector)
        raise RequestError(
            f"the projected user vector overflows the engine's dtype ({dtype}, |value| <= "
            f"{torch.finfo(row.dtype).max:.3g}): user vector values up to {peak:.3g} are far beyond the scale the "
            "projector was trained on; normalize the vector (e.g. to unit L2 norm) or fold the user in again"
        )
