"""A save's change from the last one, as a record; and applying records to a state.

The journal store appends these records to a log file; the Postgres store inserts
them as rows. Both save a whole snapshot now and then and the records since it,
so a save's bytes, and the encoding behind them, follow the change and not the
run's age. A record's payload is JSON::

    {"seq": n, "add": [messages...], "set": {field: value},
     "put": {field: {key: value}}, "drop": {field: [key...]}}

A field that is a dict (the workspace, the approvals given, the resolutions...)
changes by the keys that changed (``put``, ``drop``) rather than whole.
:class:`Changes` remembers what the store holds and makes the next record; a
state whose history was rewritten (the context policy's summary) cannot be a
record and needs a snapshot (:meth:`Changes.rewritten`).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

import msgspec

from ..errors import CheckpointCorrupt
from ..state import Message, RunState

__all__ = ["Changes", "Record", "apply", "decode_record", "encode_record"]


class Record(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One save's change (or, in the journal, a log's header record)."""

    seq: int
    add: list[Message] = []
    set: dict[str, msgspec.Raw] = {}
    put: dict[str, dict[str, msgspec.Raw]] = {}
    """Dict fields: key -> its new value."""
    drop: dict[str, list[str]] = {}
    """Dict fields: keys removed."""
    run: str = ""
    """The run the record belongs to: in the journal, its header record (seq 0) only."""
    gen: int = 0
    """The journal's header record (seq 0) only: the log's generation."""


_record_encoder = msgspec.json.Encoder()
_record_decoder = msgspec.json.Decoder(Record)
_field_encoder = msgspec.json.Encoder()
_FIELDS = {
    f.name: msgspec.json.Decoder(f.type)
    for f in msgspec.structs.fields(RunState)
    if f.name != "messages"
}
_VALUES = {
    f.name: msgspec.json.Decoder(typing.get_args(f.type)[1])
    for f in msgspec.structs.fields(RunState)
    if typing.get_origin(f.type) is dict
}
"""The dict fields, changed key by key: name -> decoder of one value."""
_PLAIN = tuple(name for name in _FIELDS if name not in _VALUES)
"""The other fields (besides the messages): immutable values, compared by identity first."""
_ABSENT = object()


def encode_record(record: Record) -> bytes:
    """A record's payload."""
    return _record_encoder.encode(record)


def decode_record(payload: bytes, *, path: str, where: str) -> Record:
    """Decode one record, or raise ``CheckpointCorrupt`` naming ``path`` and ``where`` in it."""
    try:
        return _record_decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise CheckpointCorrupt(path=path, reason=f"record at {where}: {exc}") from exc
    except RecursionError as exc:
        raise CheckpointCorrupt(
            path=path, reason=f"record at {where}: JSON nested too deeply"
        ) from exc


def apply(state: RunState, record: Record, *, path: str) -> None:
    """Apply one record's change to ``state``."""
    state.messages.extend(record.add)
    name = ""
    try:
        for name, raw in record.set.items():
            decoder = _FIELDS.get(name)
            if decoder is None:
                raise CheckpointCorrupt(path=path, reason=f"record {record.seq} sets {name!r}")
            setattr(state, name, decoder.decode(raw))
        for name, keys in record.drop.items():
            target = _keyed_field(state, name, record.seq, path=path)
            for key in keys:
                if target.pop(key, _ABSENT) is _ABSENT:
                    raise CheckpointCorrupt(
                        path=path,
                        reason=f"record {record.seq} drops {name}[{key!r}], which the state "
                        "does not hold (the log does not continue this snapshot)",
                    )
        for name, entries in record.put.items():
            target = _keyed_field(state, name, record.seq, path=path)
            value = _VALUES[name]
            for key, raw in entries.items():
                target[key] = value.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise CheckpointCorrupt(
            path=path, reason=f"record {record.seq}, field {name}: {exc}"
        ) from exc


def _keyed_field(state: RunState, name: str, seq: int, *, path: str) -> dict[str, Any]:
    if name not in _VALUES:
        raise CheckpointCorrupt(path=path, reason=f"record {seq} changes {name!r} by key")
    target: dict[str, Any] = getattr(state, name)
    return target


def _dict_delta(
    old: dict[str, Any], new: dict[str, Any]
) -> tuple[dict[str, Any], list[str]] | None:
    """The keys of ``new`` to put and of ``old`` to drop to turn ``old`` into ``new``.

    None when the whole dict is as short to write, or when replaying the delta
    would leave the keys in another order than ``new``'s (a key removed and
    added again moves to the end): the record then sets the whole field.
    """
    put = {
        key: value
        for key, value in new.items()
        if (before := old.get(key, _ABSENT)) is not value and before != value
    }
    drop = [key for key in old if key not in new]
    if len(put) + len(drop) >= len(new):
        return None
    replayed = dict(old)
    for key in drop:
        del replayed[key]
    replayed.update(put)
    if list(replayed) != list(new):
        return None
    return put, drop


@dataclass(slots=True)
class Pending:
    """What the store will hold once a record lands: hand it to :meth:`Changes.saved`."""

    values: dict[str, object]
    fields: dict[str, bytes]
    dicts: dict[str, dict[str, Any]]
    messages: int
    last: Message | None


class Changes:
    """What a store holds of one run, to make the record of the next save's change."""

    def __init__(self) -> None:
        self._values: dict[str, object] = {}
        """The plain fields' values at the last save (immutable: same object, same value)."""
        self._fields: dict[str, bytes] = {}
        """The plain fields' encodings at the last save."""
        self._dicts: dict[str, dict[str, Any]] = {}
        """Shallow copies of the dict fields at the last save."""
        self._saved_messages = 0
        self._last_message: Message | None = None
        self._summarized = 0

    def remember(self, state: RunState) -> None:
        """Take ``state`` as what the store holds (after a load or a snapshot)."""
        self._values = {name: getattr(state, name) for name in _PLAIN}
        self._fields = {name: _field_encoder.encode(value) for name, value in self._values.items()}
        self._dicts = {name: dict(getattr(state, name)) for name in _VALUES}
        self._saved_messages = len(state.messages)
        self._last_message = state.messages[-1] if state.messages else None
        self._summarized = state.summarized

    def rewritten(self, state: RunState) -> bool:
        """True when the messages saved so far are no longer a prefix of ``state.messages``."""
        if state.summarized != self._summarized or len(state.messages) < self._saved_messages:
            return True
        if self._saved_messages == 0:
            return False
        last = state.messages[self._saved_messages - 1]
        return last is not self._last_message and last != self._last_message

    def record(self, state: RunState, seq: int, *, run: str = "") -> tuple[bytes, Pending]:
        """The encoded record of ``state``'s change, numbered ``seq``; and what it saves.

        ``run``, if given, names the run in the record (rows of a table, unlike
        the records of one run's log file, could be moved between runs).

        Only what changed is encoded: a plain field that is the same object as at
        the last save is unchanged (its values are immutable), and a dict field
        equal to its copy (compared in C, by identity first) is too. Not for a
        :meth:`rewritten` state. Nothing is remembered until :meth:`saved`.
        """
        values, fields, changed = {}, {}, {}
        for name in _PLAIN:
            value = getattr(state, name)
            if value is self._values[name]:
                continue
            values[name] = value
            fields[name] = encoded = _field_encoder.encode(value)
            if encoded != self._fields[name]:
                changed[name] = msgspec.Raw(encoded)
        put: dict[str, dict[str, msgspec.Raw]] = {}
        drop: dict[str, list[str]] = {}
        dicts = {}
        for name in _VALUES:
            current: dict[str, Any] = getattr(state, name)
            if current == self._dicts[name]:
                continue
            dicts[name] = dict(current)
            delta = _dict_delta(self._dicts[name], current)
            if delta is None:
                changed[name] = msgspec.Raw(_field_encoder.encode(current))
                continue
            puts, drops = delta
            if puts:
                put[name] = {k: msgspec.Raw(_field_encoder.encode(v)) for k, v in puts.items()}
            if drops:
                drop[name] = drops
        record = Record(
            seq=seq,
            add=state.messages[self._saved_messages :],
            set=changed,
            put=put,
            drop=drop,
            run=run,
        )
        after = Pending(
            values=values,
            fields=fields,
            dicts=dicts,
            messages=len(state.messages),
            last=state.messages[-1] if state.messages else None,
        )
        return encode_record(record), after

    def saved(self, after: Pending) -> None:
        """The record :meth:`record` made is durable: the next one is the change from it."""
        self._values.update(after.values)
        self._fields.update(after.fields)
        self._dicts.update(after.dicts)
        self._saved_messages = after.messages
        self._last_message = after.last
