"""What the coordinator holds in memory for a live run: its runtime (model, parsed config, codec),
the books thread's own copy of the model, and a closing round's decoded updates. Imports
``context``, ``schemas`` and ``store``."""
