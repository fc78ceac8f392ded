"""Count the torch calls a piece of code makes, by what a chosen function was calling at the time.

    with TorchCalls(root="minigrpo/rl/loop.py:run", inside=("minigrpo/lm/model.py",)) as calls:
        train(cfg)
    calls.counts    # {("update", "own"): n, ("collect", "model"): n, ...}
    calls.syncs     # the same keys: calls that wait for the values (item, tolist, bool, ...)

Why count calls: on a GPU each torch call on a small tensor costs a kernel launch and its dispatch
(microseconds, whatever the tensor's size), and each call that reads a value back waits for the GPU;
so for small models the count, not the arithmetic, sets a step's time there, and it can be counted
on any machine. A call is "model" when a function of a file in `inside` is on the stack (a
population batches those), else "own". It counts the calls torch's Python API sees
(torch.overrides.TorchFunctionMode), not kernels.

    with TorchKernels(root=..., inside=...) as kernels:   # the same keys: the aten operators that
                                                          # compute
        train(cfg)
    kernels.counts

TorchKernels counts what reaches the dispatcher (torch.utils._python_dispatch.TorchDispatchMode),
the backward's operators too, leaving out views and metadata (an operator whose output aliases an
input without writing it): on a GPU each is about one kernel launch, where a Python call may be a
view that launches nothing, or several operators.
"""

from __future__ import annotations

import collections
import sys

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from minigrpo.bench.stack_sampler import project_stack

SYNCS = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy", "nonzero"}


def _key(frame, root: str, inside: tuple) -> tuple[str, str]:
    """(what `root` was calling at `frame`, "model" or "own")."""
    names = project_stack(frame)
    inner = names[: names.index(root)] if root in names else names  # the functions inside the root
    model = any(name.startswith(inside) for name in inner) if inside else False
    calling = (
        "(outside it)"
        if root not in names
        else inner[-1].rsplit(":", 1)[1]
        if inner
        else "(its own code)"
    )
    return calling, "model" if model else "own"


class TorchCalls(TorchFunctionMode):
    def __init__(self, root: str, inside: tuple = ()):
        super().__init__()
        self.root, self.inside = root, inside
        # (what root was calling, "own"/"model") -> calls
        self.counts: collections.Counter = collections.Counter()
        self.syncs: collections.Counter = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        key = _key(sys._getframe(1), self.root, self.inside)
        self.counts[key] += 1
        if getattr(func, "__name__", "") in SYNCS:
            self.syncs[key] += 1
        return func(*args, **(kwargs or {}))


class TorchKernels(TorchDispatchMode):
    def __init__(self, root: str, inside: tuple = ()):
        super().__init__()
        self.root, self.inside = root, inside
        # (what root was calling, "own"/"model") -> ops
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        view = any(
            r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns
        )
        if not view and not func._schema.name.startswith(
            ("aten::detach", "aten::lift", "aten::empty")
        ):
            self.counts[_key(sys._getframe(1), self.root, self.inside)] += 1
        return func(*args, **(kwargs or {}))
