"""The `ulacache` command line: the one place that ties ulacache, traces, sim, hw and reports together."""
