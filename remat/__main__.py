"""``python -m remat explain path/to/file.py:factory``: see ``remat.cli``."""

from .cli import main

raise SystemExit(main())
