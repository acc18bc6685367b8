"""Run plumbing: the run directory, the cache, metric sinks, progress, reports, benchmark runs."""
