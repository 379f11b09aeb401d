"""bench: measuring and deciding (client, workloads, stats, run, report, sweep, canary windows)."""
