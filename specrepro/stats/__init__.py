"""The statistics that check the algorithm and the speed: the exact joint of generated tokens, chi-square,
toy models, confidence intervals and the speedup formulas."""
