"""Which directory a command may import a person's agent code from.

``durably resume --agent MODULE:FACTORY`` and ``durably worker --import MODULE``
import code and run it with the person's rights. Python itself puts the current
directory first on ``sys.path`` for ``python -m``, and the resume command used to
add it too: run from a shared directory (``/tmp``, a group project folder), that
imports whatever another user planted there under the agent's name, or under the
name of anything the agent imports later.

So the current directory is importable only when it passes the rule the stores
apply to a state directory: owned by the person and writable by no group or other
user (as ssh treats ``~/.ssh``). Otherwise it is taken off the path, and a failed
import says why and how to name the code's directory (``PYTHONPATH``).
"""

from __future__ import annotations

import os
import sys

__all__ = ["make_current_directory_importable"]


def make_current_directory_importable() -> str | None:
    """Put the current directory on ``sys.path`` if it is the person's own; else say why not.

    Returns:
        None when the current directory is importable; otherwise a sentence for the
        error of an import that fails, naming the directory, the reason and the fix.
    """
    # Imported here: the stores' modules cost `durably --help` its start.
    from ..errors import UnsafePath
    from ..stores._guard import check_trusted

    try:
        here = os.getcwd()
    except OSError as exc:
        return f"the current directory cannot be read ({exc.strerror})"
    named = _named_by_pythonpath(here)
    try:
        check_trusted(os.stat(here), path=here, directory=True)
    except UnsafePath as exc:
        if not named:
            # What `python -m durably` put first: the current directory, as "" or whole.
            sys.path[:] = [entry for entry in sys.path if entry not in ("", here)]
        return (
            f"the current directory is not imported from: {exc.reason}. Put your agent's "
            "code in a directory of your own and name it: PYTHONPATH=DIR durably ..."
        )
    if "" not in sys.path and here not in sys.path:
        sys.path.insert(0, here)
    return None


def _named_by_pythonpath(directory: str) -> bool:
    """Whether the person named ``directory`` in ``PYTHONPATH`` themselves."""
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return any(entry and os.path.abspath(entry) == directory for entry in entries)
