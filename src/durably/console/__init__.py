"""``durably console``: a local web page over a store (docs/concepts.md).

Runs, a run's timeline, the workspace files it recorded, and the open questions
with forms to answer them. Pages are rendered on the server (:mod:`.pages`,
every piece of text escaped); :mod:`.server` holds the Starlette routes, the
write token and uvicorn. An answer goes through :func:`durably.decisions.answer`,
the same saved decision as ``durably answer``. Needs ``durably[console]``.
"""
