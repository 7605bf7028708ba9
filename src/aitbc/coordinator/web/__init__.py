"""The coordinator's browser-facing pages: the dashboard at ``/`` and the offline API
docs, with every asset they load shipped in the package (``static/``), so they work on a
machine without internet."""

from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"
