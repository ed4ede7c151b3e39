"""The public surface: every exception pickles with its fields; ``__all__`` says what is public."""

from __future__ import annotations

import ast
import collections.abc
import importlib
import inspect
import pickle
import pkgutil
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import durably
from _helpers.patience import stretched
from durably.errors import DurablyError

_SKIPPED_PACKAGES = ("durably.triage.sample",)
"""Package data the triage agent edits in its own workspace, not durably's code."""


def _modules() -> Iterator[ModuleType]:
    """Every module of the durably package tree, imported."""
    for name in durably.__all__:  # loaded on first use: load them, so vars(durably) has them
        getattr(durably, name)
    yield durably
    for info in pkgutil.walk_packages(durably.__path__, prefix="durably."):
        if info.name.startswith(_SKIPPED_PACKAGES) or info.name == "durably.__main__":
            continue
        yield importlib.import_module(info.name)


def _exception_classes() -> list[type[BaseException]]:
    """Every exception class defined in the package tree, found by introspection."""
    found: dict[str, type[BaseException]] = {}
    for module in _modules():
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and sys.modules.get(value.__module__) is not None
                and _defined_in(value) == module.__name__
            ):
                found[f"{module.__name__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


def _defined_in(cls: type) -> str:
    """The module whose source defines ``cls`` (some classes claim ``durably`` instead)."""
    module = inspect.getmodule(cls)
    if module is not None and module.__name__ != "durably":
        return module.__name__
    # `__module__ = "durably"`: the class's code object knows its real file.
    source = inspect.getsourcefile(cls)
    for name, candidate in sys.modules.items():
        if name.startswith("durably") and getattr(candidate, "__file__", None) == source:
            return name
    return cls.__module__


EXCEPTIONS = _exception_classes()


def _sample(annotation: Any, name: str) -> Any:
    """A value of the annotated type, distinct per parameter so a swapped field shows."""
    options = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if options and typing.get_origin(annotation) in (types.UnionType, typing.Union):
        annotation = options[0]  # `int | None`: an int
    origin = typing.get_origin(annotation) or annotation
    if origin is str:
        return f"{name}-value"
    if origin is bool:
        return True
    if origin is int:
        return len(name) + 40
    if origin is float:
        return len(name) + 0.5
    if origin in (list, collections.abc.Sequence, collections.abc.Iterable):
        return [f"{name}-1", f"{name}-2"]
    raise AssertionError(f"no sample for a parameter {name!r}: {annotation!r}; add one here")


def _build(cls: type[BaseException]) -> BaseException:
    """An instance of ``cls`` with every ``__init__`` parameter filled in."""
    if cls.__init__ is BaseException.__init__:
        return cls("a message")
    hints = typing.get_type_hints(cls.__init__)
    positional: list[Any] = []
    keywords: dict[str, Any] = {}
    for parameter in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        value = _sample(hints.get(parameter.name, parameter.annotation), parameter.name)
        if parameter.kind is parameter.KEYWORD_ONLY:
            keywords[parameter.name] = value
        else:
            positional.append(value)
    return cls(*positional, **keywords)


def test_the_walk_finds_the_exception_classes() -> None:
    """The introspective walk finds the known classes of every kind (a broken walk finds none)."""
    names = {cls.__name__ for cls in EXCEPTIONS}
    print(f"{len(EXCEPTIONS)} exception classes in the durably package tree")
    assert {"RunNotFound", "HttpToolError", "McpToolError", "KeyConflict", "StreamCut"} <= names
    assert len(EXCEPTIONS) >= 40


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda cls: cls.__qualname__)
def test_every_exception_pickles_with_its_fields(cls: type[BaseException]) -> None:
    """An exception survives a pickle round trip with its class, message and every field."""
    error = _build(cls)
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 -- our own bytes
    assert type(copy) is cls
    assert str(copy) == str(error)
    assert copy.args == error.args
    assert vars(copy) == vars(error)


def test_fields_survive_a_round_trip() -> None:
    """A field set by the constructor, not only the message, comes back after pickling."""
    error = durably.RunNotFound(run_id="r-1", where="/state")
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 -- our own bytes
    assert (copy.run_id, copy.where) == ("r-1", "/state")


def test_transport_errors_are_durably_errors() -> None:
    """A remote tool's failure is a ``DurablyError`` and still an ``Exception``."""
    from durably.transports import HttpToolError, McpToolError

    for cls in (HttpToolError, McpToolError):
        assert issubclass(cls, DurablyError)
    with pytest.raises(HttpToolError) as caught:
        raise HttpToolError("503 from the service", status=503)
    assert caught.value.status == 503


def test_all_is_sorted_and_importable() -> None:
    """``durably.__all__`` is sorted (constants, classes, functions) and every name imports."""
    names = durably.__all__

    def kind_then_name(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert list(names) == sorted(set(names), key=kind_then_name)
    for name in names:
        assert getattr(durably, name) is not None, name


def test_every_public_name_of_durably_is_in_all() -> None:
    """A name ``durably`` binds without an underscore (not a submodule) is in ``__all__``, so a
    re-export added without its entry fails here instead of hiding from star imports.
    """
    bound = {
        name
        for name in dir(durably)  # with lazily loaded names, if the module lists them
        if not name.startswith("_") and not isinstance(getattr(durably, name), ModuleType)
    }
    bound.discard("PostgresStore")  # lazy and kept out of __all__ (see the test below)
    assert sorted(bound - set(durably.__all__)) == []
    assert sorted(set(durably.__all__) - bound) == []


def test_every_all_in_the_tree_names_what_its_module_has() -> None:
    """Every module's ``__all__`` lists each name once, and each one is bound in the module."""
    checked = 0
    for module in _modules():
        names = getattr(module, "__all__", None)
        if names is None:
            continue
        checked += 1
        assert len(set(names)) == len(names), f"{module.__name__}.__all__ repeats a name"
        missing = [name for name in names if not hasattr(module, name)]
        assert missing == [], f"{module.__name__}.__all__ names what it does not bind"
    assert checked > 20


def test_a_misspelt_name_is_an_attribute_error() -> None:
    """``durably.X`` for a name it does not have raises AttributeError naming it."""
    with pytest.raises(AttributeError, match="FileStor"):
        durably.FileStor  # type: ignore[attr-defined]  # noqa: B018


def test_classes_claiming_durably_are_exported() -> None:
    """A class whose ``__module__`` is ``durably`` can be imported from ``durably``."""
    claiming = {
        cls.__qualname__
        for module in _modules()
        for cls in vars(module).values()
        if isinstance(cls, type) and cls.__module__ == "durably"
    }
    assert claiming
    assert sorted(claiming - set(durably.__all__)) == []


def test_every_public_error_is_exported() -> None:
    """Every error class in ``durably.errors.__all__`` is exported from ``durably``."""
    from durably import errors

    raised = [
        name
        for name in errors.__all__
        if isinstance(getattr(errors, name), type) and issubclass(getattr(errors, name), Exception)
    ]
    assert raised
    assert sorted(set(raised) - set(durably.__all__)) == []


def test_postgres_store_is_exported_lazily() -> None:
    """``durably.PostgresStore`` is the store class, kept out of ``__all__`` (a star import
    must not need psycopg).
    """
    from durably.postgres import PostgresStore

    assert "PostgresStore" not in durably.__all__
    assert durably.PostgresStore is PostgresStore


def test_every_name_the_removed_postgres_module_had_is_in_durably_postgres() -> None:
    """``durably.stores.postgres`` is gone (issue 33): every name it exported is in
    ``durably.postgres``, so an old import changes its module name and nothing else.
    """
    import durably.postgres

    old = [
        "MIGRATIONS",
        "QUEUED",
        "RUNS_TO_CLAIM",
        "Claim",
        "Lease",
        "Migration",
        "PostgresRun",
        "PostgresStore",
        "StoreStats",
        "current_lease",
    ]
    assert sorted(set(old) - set(durably.postgres.__all__)) == []
    for name in old:
        assert getattr(durably.postgres, name) is not None, name


def _init_source() -> ast.Module:
    return ast.parse(Path(inspect.getfile(durably)).read_text())


def test_every_lazy_name_is_re_exported_for_type_checkers_from_the_same_module() -> None:
    """The names ``durably`` loads on first use are exactly the ones it re-exports under
    ``TYPE_CHECKING`` (each from the module it is loaded from), and ``__all__`` lists them
    all but ``PostgresStore``.
    """
    tree = _init_source()
    typed: dict[str, str] = {}
    lazy: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom):
                    for alias in statement.names:
                        assert alias.asname == alias.name, "write `import X as X` (explicit)"
                        typed[alias.name] = f"{statement.module}"
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "_EXPORTS"
            and node.value is not None
        ):
            lazy = ast.literal_eval(node.value)

    assert len(typed) > 60
    assert typed == lazy
    assert sorted(durably.__all__) == sorted(set(lazy) - {"PostgresStore"})
    for name, module in lazy.items():
        assert getattr(durably, name) is getattr(importlib.import_module(f"durably.{module}"), name)


def test_closed_sets_load_from_old_checkpoints_as_enums() -> None:
    """A checkpoint written when ``kind`` and ``outcome`` were plain strings loads as the enums
    and writes back the same bytes.
    """
    from durably.state import ApprovalKind, ResolutionOutcome, decode_state, encode_state

    old = (
        b'{"format":1,"run_id":"r1","task":"t","created_at":"2026-01-01T00:00:00Z",'
        b'"phase":"paused","pending":{"c1":{"call_id":"c1","tool":"file_issue",'
        b'"arguments":"{}","asked_at":"2026-01-01T00:00:01Z","kind":"resolve",'
        b'"why":"no lookup"},"c2":{"call_id":"c2","tool":"file_issue","arguments":"{}",'
        b'"asked_at":"2026-01-01T00:00:02Z"}},'
        b'"resolutions":{"c0":{"step":2,"outcome":"not-found"}}}'
    )
    state = decode_state(old)
    assert state.pending["c1"].kind is ApprovalKind.RESOLVE
    assert state.pending["c2"].kind is ApprovalKind.APPROVE
    assert state.resolutions["c0"].outcome is ResolutionOutcome.NOT_FOUND
    assert encode_state(state) == old


def test_a_value_outside_a_closed_set_is_corrupt() -> None:
    """An outcome no durably writes is refused as a corrupt checkpoint, naming the field."""
    from durably.state import decode_state

    bad = (
        b'{"format":1,"run_id":"r1","task":"t","created_at":"2026-01-01T00:00:00Z",'
        b'"resolutions":{"c0":{"step":2,"outcome":"maybe"}}}'
    )
    with pytest.raises(durably.CheckpointCorrupt, match="outcome"):
        decode_state(bad)


def test_the_names_the_docs_write_work_after_only_import_durably() -> None:
    """``durably.decisions.AskLater()``, as docs/operators.md writes it, works in a fresh
    process that only ran ``import durably``; so do ``durably.AskLater`` and the sweep.
    """
    import subprocess

    program = (
        "import durably\n"
        "durably.decisions.AskLater()\n"
        "assert durably.AskLater is durably.decisions.AskLater\n"
        "assert durably.sweep.run_sweep and durably.transports.http_tool\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=stretched(120),
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr


def test_type_checking_is_not_a_name_of_durably() -> None:
    """The flag the type checker reads does not leak into ``dir(durably)``."""
    assert "TYPE_CHECKING" not in dir(durably)
    assert not hasattr(durably, "TYPE_CHECKING")


def test_help_on_lookup_says_what_a_lookup_is() -> None:
    """``help(durably.Lookup)`` explains a lookup and its three answers, not a bare union."""
    import pydoc

    text = pydoc.render_doc(durably.Lookup, renderer=pydoc.plaintext)  # type: ignore[attr-defined]
    for words in ("lookup", "Found(result)", "NOT_FOUND", "UNKNOWN", "parameters", "a person"):
        assert words in text.replace("\n", " "), words
    assert isinstance(durably.NOT_FOUND, durably.Lookup)
    assert isinstance(durably.Found("r"), durably.Lookup)


def _private_types(annotation: Any) -> Iterator[str]:
    """Every durably class named with a leading underscore inside ``annotation``."""
    if (
        isinstance(annotation, type)
        and annotation.__module__.startswith("durably")
        and annotation.__name__.startswith("_")
    ):
        yield f"{annotation.__module__}.{annotation.__qualname__}"
    for argument in typing.get_args(annotation):
        yield from _private_types(argument)


def test_no_private_type_appears_in_a_public_signature() -> None:
    """No public function, method or constant of ``durably`` is typed with a private class
    (the approver's ``DEFER`` answer and the lookup's answers were ``_Deferred``, ``_Answer``).
    """
    found: dict[str, list[str]] = {}
    for name in durably.__all__:
        value = getattr(durably, name)
        callables: list[tuple[str, Any]] = []
        if isinstance(value, type):
            callables += [
                (f"{name}.{attribute}", member)
                for attribute, member in vars(value).items()
                if callable(member) and (not attribute.startswith("_") or attribute == "__init__")
            ]
        elif callable(value):
            callables.append((name, value))
        else:
            found.setdefault(name, []).extend(_private_types(type(value)))
        for where, function in callables:
            try:
                hints = typing.get_type_hints(function)
            except (NameError, TypeError):
                continue
            for hint in hints.values():
                found.setdefault(where, []).extend(_private_types(hint))
    assert {where: names for where, names in found.items() if names} == {}
