"""Request checks that need the checkpoint's catalog (on top of `base.validate_*`), shared by in-process engines."""

from __future__ import annotations

from workbench.engines.base import BeamSearchRequest, RequestError


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
