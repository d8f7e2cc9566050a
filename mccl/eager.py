"""Keep torch.compile out of mccl's Python: the process group's methods always run as written.

While a region compiled by ``torch.compile`` runs, its thread has dynamo's frame hook set, and
dynamo tries to compile every Python frame that starts there, including the methods of a
process group written in Python that torch's C++ calls back into: DDP's reducer broadcasts
rebuilt bucket indices and buffers from inside a compiled forward. Dynamo cannot trace them (to
it the group is an opaque object whose private members are unknown) and raises, so the second
step of a compiled DDP model failed. Marking the code of these entry points "skip, with every
frame it calls" makes dynamo run them as plain Python, as it runs gloo's C++.

Compiled user code can also reach them through a Python object it was handed (a Work passed
into a compiled function): dynamo would then inline ``Work.wait`` and get as far as the op's
state at that moment allowed, so ranks compiled different graphs (one with the wait traced
away) and issued different collectives. The functions also carry the flag of functions
wrapped in ``torch.compiler.disable``: dynamo never inlines them but breaks the graph there (a
``fullgraph=True`` compile fails on every rank alike, as with gloo's C++ Work).

The mark is dynamo's own per-code setting (``torch._dynamo.skip`` uses it, non-recursively),
set through its C hook: no import of ``torch._dynamo`` (over a second per process here) and no
cost per call, unlike wrapping every method in ``torch.compiler.disable``. It is private to
torch (present in 2.11 and 2.13); a build without it leaves the frames unmarked.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Iterable

log = logging.getLogger(__name__)

#: Why, in dynamo's graph-break message for a call into mccl from compiled code.
DISABLED_BECAUSE = "mccl's process group and Work run in Python outside compiled graphs"

try:  # torch >= 2.11 (private: dynamo's C frame hook)
    from torch._C._dynamo.eval_frame import (
        _FrameAction,
        _FrameExecStrategy,
        set_code_exec_strategy,
    )
except ImportError:  # pragma: no cover - other torch builds
    set_code_exec_strategy = None


def _entry_points(cls: type) -> Iterable[tuple[str, types.FunctionType]]:
    """The functions ``cls`` itself defines (its own methods, not inherited C++ ones)."""
    for name, value in vars(cls).items():
        if isinstance(value, types.FunctionType):
            yield name, value


def run_eagerly(*classes: type) -> bool:
    """Mark every method the classes define to run outside torch.compile's tracing, with all
    it calls, and never to be inlined into a compiled graph; False where this torch has no
    per-code mark (the flag against inlining is set anyway)."""
    skip = (None if set_code_exec_strategy is None
            else _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
    for cls in classes:
        for _, fn in _entry_points(cls):
            fn._torchdynamo_disable = True  # type: ignore[attr-defined]
            fn._torchdynamo_disable_msg = DISABLED_BECAUSE  # type: ignore[attr-defined]
            if skip is not None:
                set_code_exec_strategy(fn.__code__, skip)
    if skip is None:
        log.debug("mccl: this torch has no per-code dynamo mark; compiled code that calls "
                  "back into the process group will fail there")
    return skip is not None
