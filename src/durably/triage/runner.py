"""A fast in-process runner for the sample's tests, and a crash reproducer.

The crash sweep runs the sample's tests thousands of times, so starting pytest
in a subprocess for each run is out of the question. Instead the ``test_*``
functions of ``<root>/tests/test_*.py`` are called in this process, against the
``todo`` package under ``<root>/todo``.

Isolation is what makes that safe:

- Every call loads the sample under module names of its own
  (``_durably_sample_<n>_todo.store``), never as ``todo``: an ``import todo``
  in the loaded code is routed to that call's copy by an ``__import__`` hook in
  the modules' builtins, so code from one workspace never leaks into a run on
  another, even in two threads at once.
- Sources are read from disk on every call and compiled in memory; nothing goes
  through the import system's bytecode cache, whose mtime check misses an edit
  of the same size within the same second. Compiled code is cached by source
  text, so an unchanged file costs a dictionary look-up.
- The call's modules are removed from ``sys.modules`` when it returns.

Tests run without a timeout: code that loops forever hangs the caller.
"""

from __future__ import annotations

import builtins
import functools
import importlib.machinery
import itertools
import linecache
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FunctionType, ModuleType, TracebackType
from typing import Any, ClassVar

__all__ = ["Crash", "TestReport", "reproduce", "run_sample_tests"]

PACKAGE = "todo"
"""The importable name of the sample's package, as its tests and users write it."""

_MAX_LISTED_FAILURES = 5
_MAX_ERROR_CHARS = 300
_counter = itertools.count(1)
_real_import = builtins.__import__
_THIS_FILE = __file__


@dataclass(frozen=True, slots=True, kw_only=True)
class TestReport:
    """What one run of the sample's tests found.

    Tests are named like pytest node IDs: ``tests/test_store.py::test_add``. A
    test file that could not be loaded (a syntax error, a failing import) is a
    failure named after the file.
    """

    __test__: ClassVar[bool] = False  # tells pytest this class is not a test

    passed: list[str]
    """Tests that returned without raising, in the order they ran."""
    failed: list[tuple[str, str]]
    """(name, one-line error) of each test that raised, and of each file that failed to load."""
    tracebacks: dict[str, str] = field(default_factory=dict)
    """Name of each failure -> its traceback, with paths relative to the workspace."""

    @property
    def ok(self) -> bool:
        """True when nothing failed and at least one test ran."""
        return not self.failed and bool(self.passed)

    def summary(self) -> str:
        """One line, e.g. ``7 passed, 1 failed: tests/test_x.py::test_y (KeyError: 3)``."""
        text = f"{len(self.passed)} passed"
        if not self.failed:
            return text
        listed = ", ".join(
            f"{name} ({error})" for name, error in self.failed[:_MAX_LISTED_FAILURES]
        )
        more = len(self.failed) - _MAX_LISTED_FAILURES
        tail = f", and {more} more" if more > 0 else ""
        return f"{text}, {len(self.failed)} failed: {listed}{tail}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Crash:
    """An exception that escaped the sample while it ran a script of commands."""

    error: str
    """The exception in one line, e.g. ``KeyError: 3``."""
    traceback: str
    """The traceback as Python prints it (without the caret lines of 3.11+)."""


def run_sample_tests(root: Path, *, only: Sequence[str] | None = None) -> TestReport:
    """Run the sample's tests found under ``root`` in this process.

    Args:
        root: a directory holding ``todo/`` and ``tests/``.
        only: run only these; each entry is a file (``tests/test_x.py`` or
            ``test_x.py``), a test function's name (``test_y``, in any file), or a
            node ID (``tests/test_x.py::test_y``). An entry that matches nothing is
            reported as a failure, so a typo never reads as success.

    Returns:
        The tests that passed and those that failed, in file then definition order.
    """
    session = _Session(Path(root))
    try:
        return session.run_tests(only)
    finally:
        session.close()


def reproduce(root: Path, commands: Iterable[str], *, path_prefix: str = "") -> Crash | None:
    """Run a crash report's commands through the sample's ``todo.app.run_script``.

    Args:
        root: a directory holding ``todo/``.
        commands: the report's input, one command line each.
        path_prefix: written before each sample path in the traceback, e.g. a
            site-packages directory ending in ``/``.

    Returns:
        The crash, or None when the commands ran to the end.
    """
    session = _Session(Path(root))
    try:
        app = session.import_module(f"{PACKAGE}.app")
        run_script: Callable[[list[str]], object] = app.run_script
        run_script(list(commands))
    except Exception as exc:  # noqa: BLE001 - the agent's code under test: any error is its crash report
        return Crash(
            error=session.one_line(exc), traceback=session.format_exception(exc, path_prefix)
        )
    finally:
        session.close()
    return None


def _compile(source: bytes, filename: str) -> CodeType:
    """``source`` compiled as if read from ``filename``."""
    try:
        code = _compile_text(source)
    except SyntaxError:
        # Compiled again to raise the error naming the file, as the import system would.
        return compile(source, filename, "exec", dont_inherit=True, optimize=0)
    return _with_filename(code, filename)


@functools.lru_cache(maxsize=512)
def _compile_text(source: bytes) -> CodeType:
    # Keyed by the text alone, so an edit always recompiles and the same file in
    # another workspace (every sweep scenario has its own) compiles once;
    # optimize=0 keeps the asserts the tests are made of, even under ``python -O``.
    return compile(source, "<sample>", "exec", dont_inherit=True, optimize=0)


def _with_filename(code: CodeType, filename: str) -> CodeType:
    """A copy of ``code`` and every code object nested in it, naming ``filename``."""
    constants = tuple(
        _with_filename(value, filename) if isinstance(value, CodeType) else value
        for value in code.co_consts
    )
    return code.replace(co_filename=filename, co_consts=constants)


class _Session:
    """One call's private copy of the sample's modules."""

    def __init__(self, root: Path) -> None:
        self.root = root.absolute()
        self.prefix = f"_durably_sample_{next(_counter)}_"
        self.modules: dict[str, ModuleType] = {}
        self.sources: dict[str, list[str]] = {}
        self.builtins: dict[str, Any] = dict(vars(builtins))
        self.builtins["__import__"] = self._import

    def close(self) -> None:
        for name in self.modules:
            sys.modules.pop(name, None)
        self.modules.clear()

    # -- loading -----------------------------------------------------------

    def import_module(self, name: str) -> ModuleType:
        """The module ``name`` (``todo`` or ``todo.x``) from this session's copy."""
        return self._load(self.prefix + name)

    def _user_name(self, real: str) -> str:
        return real.removeprefix(self.prefix)

    def _import(
        self,
        name: str,
        globals: Mapping[str, object] | None = None,
        locals: Mapping[str, object] | None = None,
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> ModuleType:
        if level > 0:
            package = str((globals or {}).get("__package__") or "")
            if not package.startswith(self.prefix):
                return _real_import(name, globals, locals, fromlist, level)
            bits = package.rsplit(".", level - 1)
            if len(bits) < level:
                raise ImportError("attempted relative import beyond top-level package")
            real = f"{bits[0]}.{name}" if name else bits[0]
            return self._from(self._load(real), fromlist or ())
        if name != PACKAGE and not name.startswith(PACKAGE + "."):
            return _real_import(name, globals, locals, fromlist, level)
        module = self._load(self.prefix + name)
        if fromlist:
            return self._from(module, fromlist)
        return self._load(self.prefix + PACKAGE)

    def _from(self, module: ModuleType, fromlist: Sequence[str]) -> ModuleType:
        """Load the submodules a ``from package import a, b`` names, as importlib does."""
        if not hasattr(module, "__path__"):
            return module
        for item in fromlist:
            if item == "*":
                self._from(module, list(getattr(module, "__all__", ())))
            elif not hasattr(module, item):
                try:
                    self._load(f"{module.__name__}.{item}")
                except ModuleNotFoundError as exc:
                    # Not a submodule: leave it to the import statement to report
                    # the missing name, unless something inside it was missing.
                    if exc.name != self._user_name(f"{module.__name__}.{item}"):
                        raise
        return module

    def _load(self, real: str) -> ModuleType:
        loaded = self.modules.get(real)
        if loaded is not None:
            return loaded
        parent_name, _, child = real.rpartition(".")
        parent = self._load(parent_name) if parent_name else None
        if parent is not None:
            directory = Path(parent.__path__[0])
        else:
            directory, child = self.root, self._user_name(real)
        package_init, plain = directory / child / "__init__.py", directory / f"{child}.py"
        if package_init.is_file():
            path, is_package = package_init, True
        elif plain.is_file():
            path, is_package = plain, False
        else:
            user = self._user_name(real)
            raise ModuleNotFoundError(f"No module named {user!r}", name=user)
        module = self._new_module(real, path, package=real if is_package else parent_name)
        if is_package:
            module.__path__ = [str(path.parent)]
        self._execute(module, path)
        if parent is not None:
            setattr(parent, child, module)
        return module

    def _new_module(self, real: str, path: Path, *, package: str) -> ModuleType:
        module = ModuleType(real)
        module.__file__ = str(path)
        module.__package__ = package
        module.__spec__ = importlib.machinery.ModuleSpec(
            real, None, origin=str(path), is_package=package == real
        )
        module.__dict__["__builtins__"] = self.builtins
        return module

    def _execute(self, module: ModuleType, path: Path) -> None:
        source = path.read_bytes()
        filename = str(path)
        self.sources[filename] = source.decode("utf-8", errors="replace").splitlines()
        code = _compile(source, filename)
        # Registered before running, as importlib does, so circular imports and
        # dataclasses (which look their module up) work.
        sys.modules[module.__name__] = module
        self.modules[module.__name__] = module
        try:
            exec(code, module.__dict__)  # noqa: S102 - running the sample is this module's purpose
        except BaseException:
            del self.modules[module.__name__]
            sys.modules.pop(module.__name__, None)
            raise

    # -- running tests -----------------------------------------------------

    def run_tests(self, only: Sequence[str] | None) -> TestReport:
        passed: list[str] = []
        failed: list[tuple[str, str]] = []
        tracebacks: dict[str, str] = {}
        selection = _Selection(only)
        tests_dir = self.root / "tests"
        files = sorted(tests_dir.glob("test_*.py")) if tests_dir.is_dir() else []
        files += [tests_dir / name for name in selection.extra_files()]
        seen: set[Path] = set()
        for path in files:
            if path in seen or not selection.wants_file(path.name):
                continue
            seen.add(path)
            relative = f"tests/{path.name}"
            if not path.is_file():
                continue
            module = self._new_module(f"{self.prefix}tests_{path.stem}", path, package="")
            try:
                self._execute(module, path)
            except Exception as exc:  # noqa: BLE001 - a test module that fails to run is a failed test
                selection.matched_file(path.name)
                failed.append((relative, self.one_line(exc)))
                tracebacks[relative] = self.format_exception(exc)
                continue
            for name, test in _test_functions(module):
                if not selection.wants_test(path.name, name):
                    continue
                node = f"{relative}::{name}"
                try:
                    test()
                except (Exception, SystemExit) as exc:  # noqa: BLE001 - a failing test in the agent's workspace is a result
                    failed.append((node, self.one_line(exc)))
                    tracebacks[node] = self.format_exception(exc)
                else:
                    passed.append(node)
        failed += [(entry, "no such test") for entry in selection.unmatched()]
        return TestReport(passed=passed, failed=failed, tracebacks=tracebacks)

    # -- reporting ---------------------------------------------------------

    def one_line(self, exc: BaseException) -> str:
        """``Type: message`` on one line; a bare assert names its line instead."""
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if not message and isinstance(exc, AssertionError):
            frames = self._frames(exc.__traceback__)
            if frames:
                filename, lineno, _, line = frames[-1]
                message = f"{line} ({self._show(filename, '')}:{lineno})"
        text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."

    def format_exception(self, exc: BaseException, path_prefix: str = "") -> str:
        """The exception and its chain, as Python prints them, paths shown from the root."""
        chain: list[tuple[BaseException, str]] = []
        seen: set[int] = set()
        current: BaseException | None = exc
        note = ""
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            chain.append((current, note))
            if current.__cause__ is not None:
                note = "\nThe above exception was the direct cause of the following exception:\n\n"
                current = current.__cause__
            elif current.__context__ is not None and not current.__suppress_context__:
                note = "\nDuring handling of the above exception, another exception occurred:\n\n"
                current = current.__context__
            else:
                current = None
        parts: list[str] = []
        for link, joint in reversed(chain):
            frames = self._frames(link.__traceback__)
            if frames:
                parts.append("Traceback (most recent call last):\n")
            for filename, lineno, name, line in frames:
                parts.append(
                    f'  File "{self._show(filename, path_prefix)}", line {lineno}, in {name}\n'
                )
                if line:
                    parts.append(f"    {line}\n")
            only = "".join(traceback.format_exception_only(type(link), link))
            parts.append(only.replace(f"{self.root}/", path_prefix))
            parts.append(joint)
        return "".join(parts)

    def _frames(self, tb: TracebackType | None) -> list[tuple[str, int, str, str]]:
        """(file, line, function, source) of each frame, without the runner's own."""
        frames: list[tuple[str, int, str, str]] = []
        while tb is not None:
            code = tb.tb_frame.f_code
            filename, lineno = code.co_filename, tb.tb_lineno
            tb = tb.tb_next
            if filename == _THIS_FILE or filename.startswith("<frozen importlib"):
                continue
            lines = self.sources.get(filename)
            if lines is not None:
                line = lines[lineno - 1] if 0 < lineno <= len(lines) else ""
            else:
                line = linecache.getline(filename, lineno)
            frames.append((filename, lineno, code.co_name, line.strip()))
        return frames

    def _show(self, filename: str, path_prefix: str) -> str:
        path = Path(filename)
        if path.is_relative_to(self.root):
            return path_prefix + path.relative_to(self.root).as_posix()
        return filename


def _test_functions(module: ModuleType) -> list[tuple[str, Callable[[], object]]]:
    """The module's own ``test*`` functions, in definition order."""
    return [
        (name, value)
        for name, value in list(vars(module).items())
        if name.startswith("test")
        and isinstance(value, FunctionType)
        and value.__module__ == module.__name__
    ]


class _Selection:
    """Which files and tests ``only`` asks for, and which of its entries matched."""

    def __init__(self, only: Sequence[str] | None) -> None:
        self.everything = only is None
        self.files: dict[str, str] = {}
        self.nodes: dict[tuple[str, str], str] = {}
        self.functions: dict[str, str] = {}
        self.matched: set[str] = set()
        for entry in only or ():
            file_part, separator, function = entry.strip().partition("::")
            file_name = file_part.removeprefix("./").removeprefix("tests/")
            if separator:
                self.nodes[(file_name, function)] = entry
            elif file_name.endswith(".py"):
                self.files[file_name] = entry
            else:
                self.functions[file_name] = entry

    def extra_files(self) -> list[str]:
        """Files asked for by name that the ``test_*.py`` pattern would not find."""
        names = set(self.files) | {file_name for file_name, _ in self.nodes}
        return sorted(name for name in names if "/" not in name and not name.startswith("test_"))

    def wants_file(self, file_name: str) -> bool:
        return (
            self.everything
            or bool(self.functions)
            or file_name in self.files
            or any(node_file == file_name for node_file, _ in self.nodes)
        )

    def matched_file(self, file_name: str) -> None:
        if file_name in self.files:
            self.matched.add(self.files[file_name])
        self.matched.update(entry for (name, _), entry in self.nodes.items() if name == file_name)

    def wants_test(self, file_name: str, function: str) -> bool:
        if self.everything:
            return True
        hits = [
            self.files.get(file_name),
            self.nodes.get((file_name, function)),
            self.functions.get(function),
        ]
        self.matched.update(entry for entry in hits if entry is not None)
        return any(entry is not None for entry in hits)

    def unmatched(self) -> list[str]:
        entries = [*self.files.values(), *self.nodes.values(), *self.functions.values()]
        return [entry for entry in entries if entry not in self.matched]
