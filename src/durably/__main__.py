"""``python -m durably``: the same as the ``durably`` command."""

from .cli import main

main()
