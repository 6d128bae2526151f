"""The paper's algorithms (Chen et al. 2023; p = draft, q = target), what a reader checks against it.

- `sampling`: the distributions both models are sampled from (temperature, top-k, top-p; greedy is one-hot),
  applied to p and to q alike before the rejection step.
- `speculative.sampling_loop` with no draft: Algorithm 1 (autoregressive sampling), one target pass per
  token.
- `speculative.sampling_loop` with a draft: Algorithm 2. Lines "for t = 1..K: sample x~_t ~ p" are the
  draft's `propose`; "compute q(x | x_1..x_n, x~_1..x~_t) in parallel for t = 1..K+1" is the one
  `runner.forward` over the last token and the K drafts; `speculative.rejection_step` is the loop over
  t with r ~ U[0, 1], accept while r < min(1, q(x~_t) / p(x~_t)), else sample from (q - p)+ normalised,
  and the bonus token from q when all K are kept (Theorem 1 is why this is exact).
- `tree`: the same rejection applied recursively over a token tree verified in one target pass, with its
  proof at the top of the module (SpecInfer-style multi-candidate sampling; a chain is the special case).
- `batch`: Algorithm 2 over several prompts at once, each row with its own acceptance length.

The loop sees the target as a runner (specrepro.engines.runners.Runner) and the draft as a proposer
(`speculative.Proposer`, implemented by specrepro.drafts); specrepro.generate turns what a user passes into
them.
"""
