"""Evaluation tasks: news summarisation, HumanEval, and a sandbox for model-written code."""
