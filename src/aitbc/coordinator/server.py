"""uvicorn's server for the coordinator: the moment it is asked to stop, the long polls end.

On SIGTERM uvicorn stops accepting connections and waits for every open request before it
runs the app's shutdown (the round driver's stop, the lease's release). A worker's long
poll (``GET /workers/{id}/job?wait=``) holds its request for up to its whole wait, so a
stop waited that long, or was forced (a second signal skips the app's shutdown). Ending
the polls when the stop begins lets the server stop on its own at once.
"""

from __future__ import annotations

from collections.abc import Callable

import uvicorn


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, *, on_stop: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_stop = on_stop

    async def on_tick(self, counter: int) -> bool:
        # Called by the server's main loop every 0.1 s, in the event loop (not in the signal
        # handler, which may run while the notifier's lock is held); True: stop serving.
        stop = await super().on_tick(counter)
        if stop:
            self._on_stop()
        return stop
