"""``python -m remat explain path/to/file.py:factory``: see ``remat.cli``."""

from .cli import main

__all__: list[str] = []

raise SystemExit(main())
