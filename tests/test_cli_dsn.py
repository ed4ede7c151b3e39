"""No command takes a database password on its command line, where every user can read it.

Issue 31, item 9: ``ps`` shows another local user each process's arguments, so a
``--dsn`` that carries a password leaks it. Every command that takes ``--dsn`` refuses
one, in the URI and the ``key=value`` forms, and names where the password goes.
"""

from __future__ import annotations

import argparse

import pytest

from durably.cli import _parser, main

SECRET = "s3cret-pw"  # noqa: S105 - the password the commands must refuse

# The fewest further arguments each command needs to be parsed at all.
ARGUMENTS = {
    "answer": ["run-1", "call-1", "yes"],
    "cancel": ["run-1"],
    "pending": [],
    "prune": ["--done", "--older-than", "30d"],
    "resume": ["run-1", "--agent", "mod:factory"],
    "console": [],
    "runs": [],
    "show": ["run-1"],
    "submit": ["--agent", "triage:m1-done-after-delete"],
    "worker": [],
    "workers": [],
}


def commands_with_a_dsn() -> list[str]:
    """Every subcommand of the whole parser that has a ``--dsn`` option."""
    # argparse has no public way to list a parser's options and subcommands.
    actions = _parser()._actions  # noqa: SLF001
    (subparsers,) = (a for a in actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    return sorted(
        name
        for name, command in subparsers.choices.items()
        if any("--dsn" in action.option_strings for action in command._actions)  # noqa: SLF001
    )


def test_the_list_of_commands_here_is_every_command_with_a_dsn() -> None:
    """A new command with --dsn must be added here, so the tests below cover it."""
    assert commands_with_a_dsn() == sorted(ARGUMENTS)


@pytest.mark.parametrize("command", sorted(ARGUMENTS))
@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://alice:{SECRET}@db.example/runs",
        f"host=db.example user=alice password={SECRET} dbname=runs",
        f"postgres://alice:{SECRET}@db.example:5432/runs?sslmode=require",
    ],
    ids=["uri", "key=value", "uri with options"],
)
def test_a_password_on_the_command_line_is_refused(
    command: str, dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 2 before anything connects, naming PGPASSWORD, ~/.pgpass and DURABLY_DSN."""
    monkeypatch.delenv("DURABLY_DSN", raising=False)
    with pytest.raises(SystemExit) as exited:
        main([command, *ARGUMENTS[command], "--dsn", dsn])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "refusing a password on the command line" in error
    for where in ("PGPASSWORD", "~/.pgpass", "DURABLY_DSN"):
        assert where in error
    assert SECRET not in error


@pytest.mark.parametrize("command", sorted(ARGUMENTS))
def test_a_dsn_without_a_password_is_accepted(command: str) -> None:
    """The password then comes from libpq's own places; the option parses as before."""
    parser = _parser([command])
    args = parser.parse_args([command, *ARGUMENTS[command], "--dsn", "postgresql://alice@db/runs"])
    assert args.dsn == "postgresql://alice@db/runs"


@pytest.mark.parametrize("command", ["answer", "pending", "resume", "submit", "worker"])
def test_durably_dsn_may_carry_the_password(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment is only the process owner's to read, so $DURABLY_DSN is not checked."""
    dsn = f"postgresql://alice:{SECRET}@db/runs"
    monkeypatch.setenv("DURABLY_DSN", dsn)
    args = _parser([command]).parse_args([command, *ARGUMENTS[command]])
    assert args.dsn == dsn
