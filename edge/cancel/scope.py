"""anyio cancel scopes made without anyio's per-scope back-end look-up.

`anyio.CancelScope()` asks sniffio which async library runs the current task and looks its
back-end up, on every scope; a stream makes three (its cut, its cancel and its clean-up's shield),
and the look-up costs about as much as the scope itself (2.4 of 6 µs to make, enter and leave one
here). The edge runs on asyncio only (uvicorn), so the first scope is made the anyio way and its
class, the asyncio back-end's own, makes the rest: the same object, the same behaviour.
"""

from __future__ import annotations

import anyio

_scope_class: type[anyio.CancelScope] | None = None


def cancel_scope(*, shield: bool = False) -> anyio.CancelScope:
    """`anyio.CancelScope(shield=shield)`, on the event loop's thread."""
    global _scope_class
    if _scope_class is None:
        scope = anyio.CancelScope(shield=shield)
        _scope_class = type(scope)
        return scope
    return _scope_class(shield=shield)
