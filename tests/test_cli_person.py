"""``durably pending``, ``answer`` and ``resume`` on the directory a user's FileStore writes."""

from __future__ import annotations

import getpass
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from _helpers.patience import stretched
from durably import Agent, Call, Effect, Reply, ScriptedModel, ToolContext, tool
from durably.cli import main
from durably.decisions import AskLater
from durably.state import ToolResult
from durably.stores.file import FileStore
from durably.tools import ToolInDoubt

EXAMPLES = Path(__file__).parent.parent / "examples"
DURABLY = [sys.executable, "-m", "durably"]


@dataclass
class Result:
    """What a command printed and how it exited."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Result]:
    """Runs one ``durably`` command in this process, in a given directory."""
    monkeypatch.delenv("DURABLY_DSN", raising=False)
    monkeypatch.setenv("COLUMNS", "200")

    def command(cwd: Path, *args: str) -> Result:
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            main(list(args))
        out, err = capsys.readouterr()
        return Result(int(exited.value.code or 0), out, err)

    return command


def in_a_process(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """One ``durably`` command in its own process, as an operator runs it."""
    environment = {**os.environ, "PYTHONPATH": str(EXAMPLES)}
    environment.pop("DURABLY_DSN", None)
    return subprocess.run(
        [*DURABLY, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=stretched(60),
        check=False,
    )


@pytest.fixture
def paused_refund(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The README's refund agent, started by the service's own code; it pauses for approval."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    refund_agent = importlib.import_module("refund_agent")
    outcome = refund_agent.agent().run_sync("refund order 1042", name="refund")
    assert outcome.status == "paused"
    return str(outcome.run_id)


def test_an_approval_round_trip_finishes_a_paused_run_of_the_users_agent(
    tmp_path: Path, paused_refund: str, run: Callable[..., Result]
) -> None:
    """``pending`` lists the question, ``answer`` saves yes, ``resume --agent`` ends: one refund."""
    listed = run(tmp_path, "pending", "runs/", "--json")
    assert listed.returncode == 0, listed.stderr
    [question] = json.loads(listed.stdout)
    assert question["run"] == paused_refund
    assert (question["call"], question["tool"], question["effect"]) == (
        "call-refund-1042",
        "refund",
        "keyed",
    )
    assert question["kind"] == "approval"
    assert json.loads(question["arguments"]) == {"order_id": "1042", "cents": 2500}

    answered = run(tmp_path, "answer", paused_refund, "call-refund-1042", "yes", "runs/")
    assert answered.returncode == 0, answered.stderr
    assert json.loads(run(tmp_path, "pending", "runs/", "--json").stdout) == []
    assert not (tmp_path / "refunds.jsonl").exists()  # answering runs nothing

    resumed = in_a_process(
        tmp_path, "resume", paused_refund, "runs/", "--agent", "refund_agent:agent"
    )

    assert resumed.returncode == 0, resumed.stderr
    assert "Refunded 25.00 on order 1042." in resumed.stdout
    ledger = (tmp_path / "refunds.jsonl").read_text().splitlines()
    assert [json.loads(line)["order"] for line in ledger] == ["1042"]
    finished = FileStore(tmp_path / "runs").read_sync(paused_refund)
    assert finished.phase == "done"
    given = finished.approvals_given["call-refund-1042"]
    assert (given.approved, given.by) == (True, f"{getpass.getuser()} (durably answer)")
    listed_runs = run(tmp_path, "runs", "runs/")
    assert paused_refund in listed_runs.stdout
    assert "done" in listed_runs.stdout


def test_a_stale_answer_is_refused_with_its_reason_and_exit_1(
    tmp_path: Path, paused_refund: str, run: Callable[..., Result]
) -> None:
    """A second answer to an answered question exits 1 and says the question was answered."""
    assert (
        run(tmp_path, "answer", paused_refund, "call-refund-1042", "yes", "runs/").returncode == 0
    )

    again = run(
        tmp_path, "answer", paused_refund, "call-refund-1042", "no", "runs/", "--reason", "stop"
    )

    assert again.returncode == 1
    assert "already answered (approved)" in again.stderr
    assert (
        FileStore(tmp_path / "runs").read_sync(paused_refund).decisions["call-refund-1042"].approved
    )


def test_an_answer_that_does_not_fit_is_refused(
    tmp_path: Path, paused_refund: str, run: Callable[..., Result]
) -> None:
    """``rerun`` does not answer an approval; a reason goes only with no (bad usage, exit 2)."""
    wrong = run(tmp_path, "answer", paused_refund, "call-refund-1042", "rerun", "runs/")
    assert wrong.returncode == 1
    assert "whether the call may run (yes or no)" in wrong.stderr
    misplaced = run(
        tmp_path, "answer", paused_refund, "call-refund-1042", "yes", "runs/", "--reason", "x"
    )
    assert misplaced.returncode == 2
    assert "reason goes with `no`" in misplaced.stderr
    assert list(FileStore(tmp_path / "runs").read_sync(paused_refund).pending) == [
        "call-refund-1042"
    ]


def test_a_run_held_by_another_process_answers_locked_exit_4(
    tmp_path: Path, paused_refund: str, run: Callable[..., Result]
) -> None:
    """While the run is owned elsewhere, answer exits 4 (locked) and saves nothing."""
    store = FileStore(tmp_path / "runs")
    handle, _ = store.open_sync(paused_refund)
    try:
        locked = run(tmp_path, "answer", paused_refund, "call-refund-1042", "yes", "runs/")
    finally:
        handle.close_sync()
    assert locked.returncode == 4
    assert "is open in another process" in locked.stderr
    assert list(store.read_sync(paused_refund).pending) == ["call-refund-1042"]


def test_a_missing_store_directory_is_named_and_nothing_is_created(
    tmp_path: Path, run: Callable[..., Result]
) -> None:
    """A mistyped store directory is a usage error naming it; no directory appears."""
    for args in (("pending", "nope/"), ("answer", "r", "c", "yes", "nope/"), ("console", "nope/")):
        result = run(tmp_path, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert "no store at nope" in result.stderr
    assert not (tmp_path / "nope").exists()


def test_resume_names_a_bad_agent_factory(
    tmp_path: Path, paused_refund: str, run: Callable[..., Result]
) -> None:
    """An --agent that cannot be imported or found is a usage error saying which part."""
    for spec, message in (
        ("refund_agent", "write MODULE:FACTORY"),
        ("no_such_module:agent", "cannot import 'no_such_module'"),
        ("refund_agent:nothing", "has no 'nothing'"),
    ):
        result = run(tmp_path, "resume", paused_refund, "runs/", "--agent", spec)
        assert result.returncode == 2, (spec, result.stderr)
        assert message in result.stderr
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "resume",
                paused_refund,
                "runs/",
                "--agent",
                "refund_agent:agent",
                "--max-resumes",
                "0",
            ]
        )
    assert exited.value.code == 2


def test_resume_drives_a_storeless_workers_agent_on_the_store_it_names(
    tmp_path: Path, paused_refund: str, run: Callable[..., Result]
) -> None:
    """A factory whose agent has no store (a Postgres worker's) resumes on the STORE given,
    the command handing the run's handle to the loop; without STORE it is a usage error.
    """
    (tmp_path / "worker_agents.py").write_text(
        "import refund_agent\n\n"
        "def agent(run_id):\n"
        "    built = refund_agent.agent()\n"
        "    built.store = None  # as a worker's factory builds it\n"
        "    return built\n"
    )
    spec = "worker_agents:agent"

    storeless = run(tmp_path, "resume", paused_refund, "--agent", spec)
    assert storeless.returncode == 2
    assert "has no store" in storeless.stderr
    assert (
        run(tmp_path, "answer", paused_refund, "call-refund-1042", "yes", "runs/").returncode == 0
    )

    resumed = run(tmp_path, "resume", paused_refund, "runs/", "--agent", spec)

    assert resumed.returncode == 0, resumed.stderr
    ledger = (tmp_path / "refunds.jsonl").read_text().splitlines()
    assert [json.loads(line)["order"] for line in ledger] == ["1042"]
    assert FileStore(tmp_path / "runs").read_sync(paused_refund).phase == "done"


def test_resume_stops_at_the_next_question_with_exit_3(
    tmp_path: Path, paused_refund: str, run: Callable[..., Result]
) -> None:
    """Resuming a run whose question is still open leaves it paused (exit 3), nothing refunded."""
    result = run(tmp_path, "resume", paused_refund, "runs/", "--agent", "refund_agent:agent")
    assert result.returncode == 3, result.stderr
    assert "1 question(s) wait for a person" in result.stdout
    assert not (tmp_path / "refunds.jsonl").exists()


class Poster:
    """A service whose reply to a post was lost: the post may or may not have landed."""

    def __init__(self) -> None:
        self.posts = 0

    def agent(self, runs: Path) -> Agent:
        """An agent with one unkeyed write whose result is always in doubt."""

        @tool(effect=Effect.WRITE)
        async def post(ctx: ToolContext, text: str) -> str:
            """Post a note (no key, no lookup)."""
            self.posts += 1
            raise ToolInDoubt("the connection dropped before the reply")

        model = ScriptedModel(
            [
                Reply(calls=[Call(id="c1", name="post", arguments='{"text": "hello"}')]),
                Reply(text="posted"),
            ]
        )
        return Agent(model=model, tools=[post], store=FileStore(runs), approver=AskLater())


def test_an_in_doubt_call_is_settled_from_the_command_line_with_its_result(
    tmp_path: Path, run: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pending`` shows why the ladder stopped; done --result becomes the call's result, no rerun;
    the step-3 resolution records the OS user who answered.
    """
    monkeypatch.setenv("LOGNAME", "alice")  # getpass.getuser() reads LOGNAME first
    poster = Poster()
    outcome = poster.agent(tmp_path / "runs").run_sync("post hello", run_id="post-1")
    assert outcome.status == "paused"

    [question] = json.loads(run(tmp_path, "pending", "runs/", "--json").stdout)
    assert (question["kind"], question["effect"], question["answers"]) == (
        "in doubt",
        "write",
        ["rerun", "done"],
    )
    assert question["started_at"] is not None
    assert question["why"]
    refused = run(tmp_path, "answer", "post-1", "c1", "yes", "runs/")
    assert refused.returncode == 1
    assert "whether the call happened (rerun or done)" in refused.stderr
    saved = run(tmp_path, "answer", "post-1", "c1", "done", "runs/", "--result", "note #7")
    assert saved.returncode == 0, saved.stderr

    finished = poster.agent(tmp_path / "runs").resume_sync("post-1")

    assert finished.status == "done"
    assert poster.posts == 1
    results = [m.content for m in finished.state.messages if isinstance(m, ToolResult)]
    assert results == ["note #7"]
    assert finished.state.resolutions["c1"].by == "alice (durably answer)"


def test_pending_prints_model_text_literally(tmp_path: Path, run: Callable[..., Result]) -> None:
    """Arguments that look like Rich markup are printed as written, never interpreted."""

    @tool(effect=Effect.KEYED, key_ttl=timedelta(hours=23), needs_approval=True)
    async def refund(ctx: ToolContext, order_id: str) -> str:
        """Refund an order."""
        return f"refunded (key {ctx.idempotency_key})"  # the service's echo of the key sent

    odd = '{"order_id": "[/bold][red]1042[/red]"}'
    model = ScriptedModel([Reply(calls=[Call(id="c1", name="refund", arguments=odd)])])
    agent = Agent(
        model=model, tools=[refund], store=FileStore(tmp_path / "runs"), approver=AskLater()
    )
    assert agent.run_sync("refund", run_id="odd-1").status == "paused"

    listed = run(tmp_path, "pending", "runs/")

    assert listed.returncode == 0, listed.stderr
    assert "[/bold][red]1042[/red]" in listed.stdout


def test_the_answer_words_on_the_command_line_are_the_ones_decisions_accepts() -> None:
    """`durably answer` offers exactly the words `durably.decisions` understands."""
    from durably.cli import _parser
    from durably.decisions import WORDS

    parser = _parser()
    for word in WORDS:
        assert parser.parse_args(["answer", "r", "c", word]).answer == word
    with pytest.raises(SystemExit):
        parser.parse_args(["answer", "r", "c", "maybe"])
    subcommands = next(a for a in parser._actions if a.dest == "command")  # noqa: SLF001 -- argparse keeps its subcommands' choices only there
    answer = subcommands.choices["answer"]  # type: ignore[index]
    choices = next(a.choices for a in answer._actions if a.dest == "answer")  # noqa: SLF001 -- argparse keeps its subcommands' choices only there
    assert tuple(choices) == WORDS


def test_acting_on_an_answer_is_not_a_restart_but_a_crash_after_it_is(
    tmp_path: Path, paused_refund: str, run: Callable[..., Result]
) -> None:
    """The open that takes a person's answer counts no restart; a SIGKILL after it does."""
    answered = run(tmp_path, "answer", paused_refund, "call-refund-1042", "yes", "runs/")
    assert answered.returncode == 0, answered.stderr
    store = FileStore(tmp_path / "runs")
    assert store.read_sync(paused_refund).answered_at is not None

    AGENT = "refund_agent:agent"  # noqa: N806
    killer = (
        "import sys\n"
        "from durably import faults\n"
        "from durably.cli import main\n"
        "with faults.installed(faults.CrashPlan(label='loop.saved.answer_taken')):\n"
        "    main(sys.argv[1:])\n"
    )
    environment = {**os.environ, "PYTHONPATH": str(EXAMPLES)}
    environment.pop("DURABLY_DSN", None)
    killed = subprocess.run(
        [sys.executable, "-c", killer, "resume", paused_refund, "runs/", "--agent", AGENT],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=stretched(60),
        check=False,
    )
    assert killed.returncode == -9, killed.stderr
    taken = store.read_sync(paused_refund)
    assert (taken.answered_at, taken.resumes) == (None, 0)

    resumed = in_a_process(
        tmp_path, "resume", paused_refund, "runs/", "--agent", "refund_agent:agent"
    )
    assert resumed.returncode == 0, resumed.stderr
    done = store.read_sync(paused_refund)
    assert (done.phase, done.resumes) == ("done", 1)
    ledger = (tmp_path / "refunds.jsonl").read_text().splitlines()
    assert [json.loads(line)["order"] for line in ledger] == ["1042"]
