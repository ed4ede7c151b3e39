"""The checkpoint format every store writes: the checksummed envelope and the change record.

- :mod:`~durably.checkpoint.envelope`: a snapshot's checksummed envelope, sealed
  and opened (:func:`~durably.checkpoint.envelope.seal`,
  :func:`~durably.checkpoint.envelope.open_sealed`, :class:`~durably.checkpoint.envelope.Sealer`);
- :mod:`~durably.checkpoint.delta`: a save's change from the last one as a record
  (:class:`~durably.checkpoint.delta.Changes`), and applying records to a state.

It sits just above :mod:`durably.state`; the file stores, the LangGraph checkpointer and
the Postgres store all import it downward. A third-party store may use it too.
"""
