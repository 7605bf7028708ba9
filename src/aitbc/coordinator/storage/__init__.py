"""What the coordinator keeps of its blob store: pins, and retention that deletes the rest. Imports
``context`` and ``store``."""
