"""Measuring this machine and choosing a setting: `tune` (sr.tune, specrepro-tune) times the candidate
runners and whole speculative loops; `costs` is the one measurement of c and v(K) behind every speed number.
Above the algorithm and the drafts, since both run them."""
