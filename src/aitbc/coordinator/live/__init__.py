"""What the coordinator holds in memory for a live run: its runtime (model, parsed config:
aggregator, staleness rules), the checks a ``distribute`` request's mode asks
(``mode_config``), the books thread's own copy of the model, and a closing round's decoded
updates. Imports ``context``, ``schemas`` and ``store``."""
