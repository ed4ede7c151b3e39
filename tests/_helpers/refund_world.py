"""The refunds world both agent adapters' tests run in: the fake service and the sweep job.

tests/pydantic_ai/_pai_world.py and tests/openai_agents/_oai_world.py each build an
agent of their framework against this :class:`Service`: a refund (keyed when keys
are honoured), an e-mail, a note and a read of the order. The service is a
directory of JSON-lines files, one line per effect, written with one ``write``
each, so it survives the SIGKILL of the process that called it. :class:`RefundJob`
is everything of the ``durably.sweep`` job but the agent.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import durably
from _helpers.peer import kill_once
from durably.sweep import RUN_ID, World, digest_files

TASK = "refund order 1042, tell the customer, and note it"
ANSWER = "Refunded 1042; customer told; noted."
EMAIL = {"to": "a@b.c", "text": "order 1042 is refunded"}
NOTE = "refund 1042 done"


class Service:
    """The fake service: refunds (deduplicated on keys if asked), e-mails and notes."""

    def __init__(
        self,
        root: Path,
        *,
        honour_keys: bool = True,
        doubt: frozenset[str] = frozenset(),
        kill_after: str | None = None,
    ) -> None:
        self.root = root
        self.honour_keys = honour_keys
        self.doubt = doubt
        """Kinds of effect ("notes") whose request is performed but its answer lost."""
        self.kill_after = kill_after
        """A kind of effect ("refunds") after whose first write the process SIGKILLs itself."""

    def prepare(self) -> None:
        """Make the service's directory."""
        self.root.mkdir(parents=True, exist_ok=True)

    def lines(self, name: str) -> list[dict[str, Any]]:
        """Every record of one kind of effect, in order."""
        path = self.root / f"{name}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def _append(self, name: str, record: dict[str, Any]) -> None:
        with (self.root / f"{name}.jsonl").open("a") as out:
            out.write(json.dumps(record) + "\n")
        self.after_write(name)

    def after_write(self, name: str) -> None:
        """What happens once an effect is written, before its answer reaches the tool."""
        if name == self.kill_after:
            kill_once(self.root)
        if name in self.doubt:
            raise durably.ToolInDoubt(f"the {name} service took the request and never answered")

    def refund(self, *, order: str, key: str | None) -> str:
        """Refund an order; with keys honoured, a repeated key gets the first refund back."""
        if self.honour_keys and key is not None:
            for entry in self.lines("refunds"):
                if entry["key"] == key:
                    return f"refund {entry['id']} (replayed)"
        number = len(self.lines("refunds")) + 1
        self._append("refunds", {"id": number, "order": order, "key": key})
        return f"refund {number}"

    def send_email(self, *, to: str, text: str) -> str:
        """Send an e-mail (no key: a repeat sends it again)."""
        self._append("emails", {"to": to, "text": text})
        return f"sent to {to}"

    def post_note(self, *, text: str) -> str:
        """Post a note (no key, no way to look it up)."""
        self._append("notes", {"text": text})
        return "noted"

    def effects(self) -> Counter[str]:
        """Every effect performed, as a multiset of descriptions."""
        found = Counter(f"refund {e['order']}" for e in self.lines("refunds"))
        found.update(f"email {e['to']}: {e['text']}" for e in self.lines("emails"))
        found.update(f"note {e['text']}" for e in self.lines("notes"))
        return found


class RefundJob:
    """The refunds world as a ``durably.sweep`` job, all but its agent: the judge, kills and table.

    Each adapter's job names itself (``name``) and builds its agent (``agent``).
    """

    def _service(self, world: World) -> Service:
        return Service(world.root / "service", honour_keys=world.config.honour_keys)

    def prepare(self, world: World) -> None:
        """Make the service's directory."""
        self._service(world).prepare()

    def task(self) -> str:
        """The task the run is started with."""
        return TASK

    def call_log(self, world: World) -> durably.CallLog:
        """Where the model's asks are logged."""
        return durably.CallLog(world.root / "model.jsonl")

    def effects(self, world: World) -> Counter[str]:
        """What the run did to the service."""
        return self._service(world).effects()

    def oracle(self, world: World, request: durably.ResolveRequest) -> durably.Rerun | durably.Done:
        """A person who checks the service: done when the effect is there, else rerun."""
        service = self._service(world)
        arguments = json.loads(request.arguments)
        if request.tool == "refund":
            found = any(e["key"] == request.idempotency_key for e in service.lines("refunds"))
        elif request.tool == "send_email":
            found = arguments in service.lines("emails")
        else:
            found = arguments in service.lines("notes")
        return (
            durably.Done(f"{request.tool} done (checked by a person)") if found else durably.Rerun()
        )

    def checks(self, world: World, state: durably.RunState) -> list[str]:
        """A problem when the run did not end with the scripted answer."""
        return [] if state.answer == ANSWER else [f"wrong answer {state.answer!r}"]

    def fingerprint(self, world: World) -> str:
        """A digest of the files a crash could have changed."""
        service = world.root / "service"
        files: Sequence[Path] = [
            world.store_dir / f"{RUN_ID}.json",
            service / "refunds.jsonl",
            service / "emails.jsonl",
            service / "notes.jsonl",
            world.root / "model.jsonl",
            world.questions_log,
        ]
        return digest_files(files)
