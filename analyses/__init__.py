"""headscope.analyses: per-head statistics, role verdicts and pruning studies, as tidy frames."""
