"""Hook points: identity modules every activation passes through, addressed by name.

As in TransformerLens, each activation has a stable name given by its module path,
e.g. ``blocks.3.attn.hook_pattern``. A hook is a function ``fn(tensor, name)`` that
returns ``None`` (observe) or a tensor (replace). :func:`hooks` installs hooks for the
duration of a ``with`` block and removes them in ``finally``, even on an exception.

>>> import torch
>>> hp = HookPoint(); hp.name = "x"
>>> seen = []
>>> with hooks([(hp, lambda t, name: seen.append((name, t.sum().item())))]):
...     _ = hp(torch.ones(3))
>>> seen, hp.active
([('x', 3.0)], False)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import contextmanager

import torch
from torch import nn

HookFn = Callable[[torch.Tensor, str], "torch.Tensor | None"]


class HookPoint(nn.Module):
    """Identity module; ``active`` tells the model whether anyone is listening (so the
    attention can skip materialising patterns when nobody asks for them)."""

    def __init__(self):
        super().__init__()
        self.name: str = ""
        self._fns: list[HookFn] = []

    @property
    def active(self) -> bool:
        return bool(self._fns)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for fn in self._fns:
            out = fn(x, self.name)
            if out is not None:
                if out.shape != x.shape:
                    raise ValueError(
                        f"hook on {self.name} must return a tensor of shape {tuple(x.shape)}; got {tuple(out.shape)}"
                    )
                x = out
        return x


def name_hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Give every HookPoint its module path as name; return ``{name: hook_point}``."""
    points = {}
    for name, mod in model.named_modules():
        if isinstance(mod, HookPoint):
            mod.name = name
            points[name] = mod
    return points


@contextmanager
def hooks(pairs: Iterable[tuple[HookPoint, HookFn]]):
    """Install ``(hook_point, fn)`` pairs; remove them on exit, whatever happens."""
    installed: list[tuple[HookPoint, HookFn]] = []
    try:
        for hp, fn in pairs:
            hp._fns.append(fn)
            installed.append((hp, fn))
        yield
    finally:
        for hp, fn in installed:
            hp._fns.remove(fn)
