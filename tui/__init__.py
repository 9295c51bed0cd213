"""loadmaster console (Textual). Renders backend snapshots and posts intents; no I/O of its own."""
