"""Test your own agent: sweep it at every crash point, and make its warnings errors.

:func:`sweep_agent` is the pytest helper for an agent you wrote: give it a
factory that builds the agent from a :class:`Harness` (the scripted model, the
store, the approver and a :class:`FakeService` standing in for your service),
the model's replies and the task, and it SIGKILLs the run at every crash point,
at depth 1 and 2, in three worlds:

- ``keys honoured``: the service deduplicates on the keys it is sent;
- ``keys ignored``: it does not, so every ``keyed`` tool counts as ``write``
  (what a service that forgot the key does) and its lookup or a person settles it;
- ``fickle model``: the model answers differently when asked again.

It fails (``AssertionError`` with the table) on any duplicated or lost effect,
a saved reply paid twice, a run that did not finish, or a ``keyed`` tool that
returned without reading its key (:class:`~durably.KeyNotSent`).

:func:`strict` makes :class:`~durably.KeyNotSent` an error for the code under
it: the run stops at the call instead of going on (pytest's
``filterwarnings = ["error"]`` does the same for a whole suite).
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..approval import Approver, Done, Rerun, ResolveRequest
from ..loop import Agent
from ..models import CallLog, Reply, ScriptedModel
from ..state import Effect, RunState
from ..stores.file import FileStore
from ..sweep.core import CONFIGS, Config, SweepReport, World, digest_files, run_sweep
from ..tools import NOT_FOUND, Found, KeyNotSent, Lookup

__all__ = ["FakeService", "Harness", "strict", "sweep_agent"]

SWEPT: tuple[Config, ...] = CONFIGS[:3]
"""The worlds :func:`sweep_agent` sweeps: keys honoured, keys ignored, a fickle model."""


@contextmanager
def strict() -> Iterator[None]:
    """Within this block, a ``keyed`` call that never read its key raises ``KeyNotSent``.

    The loop lets the error out of ``run``/``resume`` (the call's result is not
    saved), so the test fails at the call that would repeat its effect after a
    crash, not after a crash that repeated it.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("error", KeyNotSent)
        yield


class FakeService:
    """A stand-in for the service your tools call, kept in a file so it outlives a SIGKILL.

    Each effect is one line of ``effects.jsonl`` in ``root``. When it honours
    keys, a request with a key it has seen returns the first response again
    instead of acting, as Stripe or durably's middleware would.

    Args:
        root: its directory (made if missing).
        honour_keys: deduplicate on keys (the sweep's ``keys ignored`` world says no).
    """

    def __init__(self, root: Path, *, honour_keys: bool = True) -> None:
        self.root = root
        self.honour_keys = honour_keys
        root.mkdir(parents=True, exist_ok=True)
        self._path = root / "effects.jsonl"

    def perform(self, what: str, *, key: str | None) -> str:
        """Do ``what`` (a description of the effect), sent with ``key``; return the response.

        Pass ``ctx.idempotency_key`` as ``key``, as the real request's
        ``Idempotency-Key`` header would carry it; ``None`` is a request sent without one.
        """
        if self.honour_keys and key is not None:
            for entry in self._entries():
                if entry["key"] == key:
                    return str(entry["response"])
        response = f"{what}: done (#{len(self._entries()) + 1})"
        with self._path.open("a") as out:
            out.write(json.dumps({"what": what, "key": key, "response": response}) + "\n")
        return response

    def find(self, key: str) -> str | None:
        """The response to the effect made with ``key``, None if there was none."""
        for entry in self._entries():
            if entry["key"] == key:
                return str(entry["response"])
        return None

    def lookup(self, key: str) -> Lookup:
        """A lookup's answer for ``key``: ``Found(response)`` or ``NOT_FOUND``."""
        found = self.find(key)
        return NOT_FOUND if found is None else Found(found)

    def effects(self) -> list[str]:
        """Every effect performed, in order (a repeat shows twice)."""
        return [str(entry["what"]) for entry in self._entries()]

    def _entries(self) -> list[dict[str, Any]]:
        if not self._path.exists():
            return []
        lines = self._path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]


@dataclass(frozen=True, kw_only=True)
class Harness:
    """What an agent factory builds the agent from, in every process of the sweep."""

    model: ScriptedModel
    """The scripted model (logged, fickle in the ``fickle model`` world)."""
    store: FileStore
    approver: Approver
    """Approves every call; answers in-doubt questions by asking the service."""
    service: FakeService
    root: Path
    """The world's directory, for anything else the agent needs (a workspace, say)."""


AgentFactory = Callable[[Harness], Agent]


class _UserJob:
    """A :class:`~durably.sweep.SweepJob` made of an agent factory, replies and a task."""

    def __init__(self, factory: AgentFactory, replies: Sequence[Reply], task: str) -> None:
        self.factory, self.replies, self._task = factory, list(replies), task
        self.name = getattr(factory, "__name__", "agent")

    def prepare(self, world: World) -> None:
        (world.root / "service").mkdir()

    def task(self) -> str:
        return self._task

    def _service(self, world: World) -> FakeService:
        return FakeService(world.root / "service", honour_keys=world.config.honour_keys)

    def agent(self, world: World, approver: Approver) -> Agent:
        # In the sweep's own processes only (never the caller's): the warning becomes a
        # failed check of the scenario, so the table still shows what the crash repeated.
        _record_key_warnings(world.root / "key-warnings.txt")
        harness = Harness(
            model=ScriptedModel(
                self.replies, log=world.root / "model.jsonl", fickle=world.config.fickle
            ),
            store=world.store(),
            approver=approver,
            service=self._service(world),
            root=world.root,
        )
        agent = self.factory(harness)
        if not world.config.honour_keys:
            # A service that ignores keys: a keyed tool is as good as a write, and its
            # lookup (or a person) must settle it after a crash.
            agent.tools = {
                name: replace(t, effect=Effect.WRITE, key_ttl=None)
                if t.effect is Effect.KEYED
                else t
                for name, t in agent.tools.items()
            }
        return agent

    def call_log(self, world: World) -> CallLog:
        return CallLog(world.root / "model.jsonl")

    def effects(self, world: World) -> Counter[str]:
        return Counter(self._service(world).effects())

    def oracle(self, world: World, request: ResolveRequest) -> Rerun | Done:
        found = self._service(world).find(request.idempotency_key)
        return Rerun() if found is None else Done(found)

    def checks(self, world: World, state: RunState) -> list[str]:
        failed = []
        wanted = self.replies[-1].text if self.replies else None
        if state.answer != wanted:
            failed.append(f"the answer is {state.answer!r}, not the last reply's {wanted!r}")
        warned = world.root / "key-warnings.txt"
        if warned.exists():
            failed += sorted(set(warned.read_text().splitlines()))
        return failed

    def fingerprint(self, world: World) -> str:
        files = [p for p in sorted(world.root.rglob("*")) if p.is_file()]
        return digest_files(
            [p for p in files if not p.name.startswith(".") and p.name != "key-warnings.txt"]
        )


def _record_key_warnings(path: Path) -> None:
    """Write every ``KeyNotSent`` of this process to ``path``; other warnings as before."""
    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, KeyNotSent):
            with path.open("a") as out:
                out.write(f"KeyNotSent: {message}\n")
            return
        shown(message, category, *args, **kwargs)

    warnings.simplefilter("always", KeyNotSent)
    warnings.showwarning = show


def sweep_agent(
    agent: AgentFactory,
    *,
    replies: Sequence[Reply],
    task: str,
    depth: int = 2,
    jobs: int = 1,
    configs: Sequence[Config] = SWEPT,
) -> SweepReport:
    """Sweep your agent at every crash point and fail on anything a crash repeated or lost.

    Args:
        agent: builds the agent from a :class:`Harness`, in each process: pass
            it ``harness.model``, ``harness.store`` and ``harness.approver``, and
            have its tools call ``harness.service`` with ``ctx.idempotency_key``.
        replies: the scripted model's reply for each turn; the last one's text
            is the answer every scenario must end with.
        task: the task the run is started with.
        depth: 2 (default) also crashes a second time during each recovery.
        jobs: worker processes.
        configs: the worlds swept (default: keys honoured, keys ignored, fickle model).

    Returns:
        The report, when every row is clean.

    Raises:
        AssertionError: the problems, the checks that failed, and the table.
    """
    report = run_sweep(_UserJob(agent, replies, task), configs=configs, depth=depth, jobs=jobs)
    problems = report.problems()
    if problems:
        checks = sorted({check for r in report.results for check in r.failed_checks})
        raise AssertionError("\n".join([*problems, *checks[:5], report.text()]))
    return report
