"""The triage agent's tools, each declared with an honest effect.

=================  ============  ========  ==========================================
tool               effect        approval  after a crash, in doubt
=================  ============  ========  ==========================================
list_reports       read          no        rerun
show_report        read          no        rerun
read_code          read          no        rerun
search_issues      read          no        rerun
run_tests          read          no        rerun
write_test         idempotent    no        rerun (same content overwrites)
file_issue         keyed         yes       rerun with the same key; lookup by key
comment_issue      keyed         no        rerun with the same key; lookup by key
code_patch         write         no        lookup: compare the file's hash with the intended one
=================  ============  ========  ==========================================

When the tracker is told to ignore keys, ``file_issue`` and ``comment_issue``
are declared ``write`` (honestly: a repeat would act twice). Their lookups do
not use the tracker's key records (it keeps none then) but search the issues
and comments for the key each write carried, which the tracker records with
the write in one transaction: a certain answer either way.

Every patch applied is appended to the world's ``patches.jsonl`` (the patch
tool's receiver is the file system; this is its audit trail). The ledger is
part of the patch's effect, and a kill can fall between the file's rename and
the ledger's line: so the patch's lookup, when it finds the file already
patched, also settles the ledger (adds the line for that call's key if it is
missing). The tool itself records every patch it applies, even under a key
already recorded: a ledger that hid a repeat would hide a duplicate. The
ladder's verdict and the ledger can then never disagree
(``docs/agent-authors.md``, "Ledgers").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import msgspec

from .._sysio import append_line, read_file
from ..state import Effect
from ..tools import NOT_FOUND, UNKNOWN, Found, Lookup, Tool, ToolContext, tool
from ..workspace import Workspace, sha256_bytes
from .runner import run_sample_tests
from .tracker import Tracker
from .world import Task, World

__all__ = ["ToolOptions", "applied_patches", "make_tools", "patches_log"]


@dataclass(frozen=True, kw_only=True)
class ToolOptions:
    """How the world's services behave, for the sweep's configurations."""

    honour_keys: bool = True
    """The tracker deduplicates on idempotency keys."""
    key_ttl: timedelta = timedelta(hours=24)
    refile_guard: bool = True
    """The tracker refuses a second filing for a cause."""


def make_tools(world: World, task: Task, tracker: Tracker, options: ToolOptions) -> list[Tool]:  # noqa: C901 - one closure per demo tool over the same world; each is short, their sum counts here
    """Build the triage tools over one run's world."""
    reports = {report.id: report for report in task.reports}
    keyed = Effect.KEYED if options.honour_keys else Effect.WRITE
    ttl = options.key_ttl if options.honour_keys else None

    @tool(effect=Effect.READ)
    async def list_reports(ctx: ToolContext) -> str:
        """List the crash reports of this batch: id, time and the exception line."""
        rows = []
        for report in task.reports:
            last = report.traceback.strip().splitlines()[-1]
            rows.append({"id": report.id, "timestamp": report.timestamp, "error": last})
        return json.dumps(rows)

    @tool(effect=Effect.READ)
    async def show_report(ctx: ToolContext, report_id: str) -> str:
        """Show one crash report in full: input, traceback, version."""
        report = reports.get(report_id)
        if report is None:
            raise LookupError(f"no report {report_id!r}; list_reports shows the ids")
        return msgspec.json.encode(report).decode()

    @tool(effect=Effect.READ)
    async def read_code(ctx: ToolContext, path: str) -> str:
        """Read a file of the codebase, with line numbers."""
        text = _workspace(ctx).read_text(path)
        return "\n".join(f"{n:4} {line}" for n, line in enumerate(text.splitlines(), 1))

    @tool(effect=Effect.READ)
    async def search_issues(ctx: ToolContext, query: str) -> str:
        """Search the tracker's issues by words in their title, body or cause."""
        return msgspec.json.encode(tracker.search(query)).decode()

    @tool(effect=Effect.READ)
    async def run_tests(ctx: ToolContext) -> str:
        """Run the codebase's test suite and report passes and failures."""
        return run_sample_tests(_workspace(ctx).root).summary()

    @tool(effect=Effect.IDEMPOTENT)
    async def write_test(ctx: ToolContext, path: str, content: str) -> str:
        """Write a regression test file under tests/ (replacing it if it exists)."""
        if not path.startswith("tests/") or not path.endswith(".py"):
            raise ValueError("regression tests go in tests/<name>.py")
        digest = _workspace(ctx).write(path, content)
        return f"wrote {path} ({len(content.encode())} bytes, sha256 {digest[:12]})"

    async def find_issue(
        ctx: ToolContext, title: str, body: str, cause: str, reports: list[str]
    ) -> Lookup:
        for issue in tracker.issues():
            if issue.key == ctx.idempotency_key:
                return Found(_for_model(issue))
        return NOT_FOUND

    @tool(effect=keyed, key_ttl=ttl, needs_approval=True, lookup=find_issue)
    async def file_issue(
        ctx: ToolContext, title: str, body: str, cause: str, reports: list[str]
    ) -> str:
        """File one issue for one root cause, naming the crash reports it explains."""
        filed = tracker.file_issue(
            title=title, body=body, cause=cause, reports=reports, key=ctx.idempotency_key
        )
        return _for_model(filed)

    async def find_comment(ctx: ToolContext, number: int, body: str) -> Lookup:
        for comment in tracker.comments(number):
            if comment.key == ctx.idempotency_key:
                return Found(_for_model(comment))
        return NOT_FOUND

    @tool(
        effect=keyed,
        key_ttl=ttl,
        lookup=find_comment,
    )
    async def comment_issue(ctx: ToolContext, number: int, body: str) -> str:
        """Add a comment to an issue (for example, the fix that closes it)."""
        comment = tracker.comment(number=number, body=body, key=ctx.idempotency_key)
        return _for_model(comment)

    async def patched(ctx: ToolContext, path: str, old: str, new: str) -> Mapping[str, str]:
        return {path: _apply(_workspace(ctx).read_text(path), path, old, new)}

    async def find_patch(ctx: ToolContext, path: str, old: str, new: str) -> Lookup:
        intended = ctx.intended.get(path)
        current = _workspace(ctx).read_text(path)
        if intended is not None and sha256_bytes(current) == intended:
            # Killed between the rename and the ledger line: the effect happened, so
            # the ledger must say so before the ladder records it as done.
            _record_patch(world, path=path, key=ctx.idempotency_key, unless_recorded=True)
            return Found(f"patched {path} (the file already has the intended content)")
        if (
            intended is not None
            and current.count(old) == 1
            and sha256_bytes(current.replace(old, new, 1)) == intended
        ):
            return NOT_FOUND  # the file is exactly as it was before the patch
        return UNKNOWN

    @tool(effect=Effect.WRITE, intends=patched, lookup=find_patch)
    async def code_patch(ctx: ToolContext, path: str, old: str, new: str) -> str:
        """Replace one exact snippet of a source file with new text."""
        workspace = _workspace(ctx)
        content = _apply(workspace.read_text(path), path, old, new)
        digest = workspace.write(path, content)
        _record_patch(world, path=path, key=ctx.idempotency_key)
        return f"patched {path} (sha256 {digest[:12]})"

    return [
        list_reports,
        show_report,
        read_code,
        search_issues,
        run_tests,
        write_test,
        file_issue,
        comment_issue,
        code_patch,
    ]


def _apply(text: str, path: str, old: str, new: str) -> str:
    count = text.count(old)
    if count != 1:
        raise ValueError(f"the snippet to replace occurs {count} times in {path}, not once")
    return text.replace(old, new, 1)


def _for_model(record: msgspec.Struct) -> str:
    """A tracker record as the model sees it: without the idempotency key it carried.

    Keys travel in the harness's channel only; a key in a tool result could be
    copied by the model into arguments it writes.
    """
    fields = msgspec.structs.asdict(record)
    fields.pop("key", None)
    return msgspec.json.encode(fields).decode()


def _workspace(ctx: ToolContext) -> Workspace:
    if ctx.workspace is None:
        raise RuntimeError("the triage tools need a workspace")
    return ctx.workspace


def patches_log(world: World) -> Path:
    """The audit trail of patches applied in a world, one JSON line each."""
    return world.root / "patches.jsonl"


def _record_patch(world: World, *, path: str, key: str, unless_recorded: bool = False) -> None:
    """Add the ledger line for a patch made under ``key`` (``unless_recorded``: if none is)."""
    if unless_recorded and any(entry.get("key") == key for entry in applied_patches(world)):
        return
    line = json.dumps({"path": path, "key": key}) + "\n"
    append_line(patches_log(world), line.encode())


def applied_patches(world: World) -> list[dict[str, str]]:
    """Every patch applied in a world, in order."""
    try:
        text = read_file(patches_log(world)).decode()  # a planted link is refused, not read
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line]
