"""The torchrun entry point of tests/test_torchrun.py: `workbench run` as `python -m workbench.cli` runs it,
plus a record of the gradient of every optimizer step (after the all-reduce and the clip, i.e. exactly what
AdamW applies), which every rank saves to `$WORKBENCH_GRADS_DIR/rank<r>.pt`.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/torchrun_worker.py run study.yaml

The record wraps `torch.nn.utils.clip_grad_norm_`, which train.py looks up at each step; nothing else changes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def grad_recorder(path: Path):
    """A stand-in for `torch.nn.utils.clip_grad_norm_` that clips, then appends the clipped gradients (one
    list per optimizer step, in the optimizer's parameter order) to the list it saves at `path`."""
    import torch

    steps: list = []
    clip = torch.nn.utils.clip_grad_norm_

    def clip_and_record(params, *args, **kwargs):
        params = list(params)
        out = clip(params, *args, **kwargs)
        steps.append([None if p.grad is None else p.grad.detach().cpu().clone() for p in params])
        torch.save(steps, path)
        return out

    return clip_and_record


def main() -> int:
    import torch

    from workbench import cli

    grads = Path(os.environ["WORKBENCH_GRADS_DIR"])
    grads.mkdir(parents=True, exist_ok=True)
    torch.nn.utils.clip_grad_norm_ = grad_recorder(grads / f"rank{os.environ.get('RANK', '0')}.pt")
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
