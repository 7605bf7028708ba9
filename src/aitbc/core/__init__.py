"""Pure tensor algorithms: no I/O, no clocks, no globals beyond registries."""
