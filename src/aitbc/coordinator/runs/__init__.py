"""The owner's hands on a run: creating, funding, hiring, distributing, stopping (``owner``),
manual phase control (``control``), and the read-only views the API and the dashboard return.
Imports ``rounds`` and everything below it."""
