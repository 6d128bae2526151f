"""The timing harness (`specrepro-bench`): side-by-side runs of ArS, SpS and peers on this machine, its
report, and per-phase profiling of the speculative loop."""
