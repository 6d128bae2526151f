"""The statistics that check the algorithm: the exact joint of generated tokens, chi-square, the deliberately
wrong samplers that must be rejected, toy models, confidence intervals and the speedup formulas."""
