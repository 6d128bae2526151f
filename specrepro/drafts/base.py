"""The base class of draft strategies, and the draft made from any HF causal LM (Algorithm 2's draft model).

A draft proposes k tokens after `seq` and returns the distribution each was drawn from (p rows over the
full vocabulary, after the same sampling transforms the target gets). Deterministic proposers return
one-hot rows, which keeps the rejection step lossless. Feature drafts may read the target's last hidden
states, which the verification pass computes anyway.
"""
from __future__ import annotations

import torch

from ..algorithm.sampling import SamplingConfig, sample
from ..algorithm.tree import attention_mask
from ..engines.runners import HFRunner, Runner, context_window, vocab_size
from .growing import draft_children, grow


class Draft:
    """Base class of draft strategies (specrepro.algorithm.speculative.Proposer is what the loop needs).

    Subclasses set `vocab_size` (the target's, since p is over the target vocabulary) and implement
    `propose`. `calls` counts the forward passes the draft made (its share of the cost). `children` is how
    drafts that grow trees draw a node's sampled children (specrepro.drafts.growing).
    """

    vocab_size: int
    wants_target_hidden: bool = False
    context_window: int | None = None
    children = staticmethod(draft_children)

    def __init__(self) -> None:
        self.calls = 0

    def reset(self) -> None:
        """Forget any state from a previous generation."""
        self.calls = 0

    def offer_pass_costs(self, costs) -> None:
        """The target's measured v(n) (a pass over n + 1 tokens / a one-token pass, n = 1..N), offered by
        sr.tune's Setting (`setting.apply(draft)`): drafts with a stop rule that weighs a proposed token against
        what verifying it costs take it (the datastore draft); others ignore it."""

    def propose(
        self,
        seq: torch.Tensor,
        k: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None = None,
        target_hidden: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Propose k tokens after seq ([n] LongTensor).

        target_hidden: [n - 1, H] target hidden states for seq[:-1] (only if wants_target_hidden).
        Returns tokens [j] and p [j, V] with j <= k, row t the distribution token t was drawn from.
        """
        raise NotImplementedError


def common_prefix_length(a: torch.Tensor, b: torch.Tensor) -> int:
    m = min(a.shape[0], b.shape[0])
    differ = (a[:m] != b[:m]).nonzero()
    return int(differ[0]) if differ.numel() else m


class ModelDraft(Draft):
    """A draft that is a plain causal LM sharing the target's tokenizer.

    Its KV cache follows the accepted sequence: on each call it keeps the longest prefix it has already
    processed and feeds only the rest (the correction token, or the last draft plus the bonus token).

    confidence_threshold (adaptive lookahead, like HF's dynamic speculation): stop drafting before token
    t > 1 when the draft's own distribution for it has max probability below the threshold. The stop
    depends only on the draft, never on the target, so the output stays exactly the target's.
    """

    def __init__(self, model, confidence_threshold: float | None = None, tokens: int | None = None):
        """model: an HF causal LM (run through HFRunner) or a runner with the HFRunner interface.

        tokens: how many of the model's vocabulary rows are real tokens (its tokenizer's length; default: the
        model's `tokenizer_length` attribute, which specrepro.drafts.spec.make_draft sets for "model:" drafts,
        else unknown). The rows after them are padding, which the draft never proposes, and with it the draft
        can speak a target vocabulary that differs from its own only in padding (`fit_vocab`).
        """
        super().__init__()
        tokens = tokens if tokens is not None else getattr(model, "tokenizer_length", None)
        if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1):
            raise ValueError(f"tokens must be an integer >= 1 (the tokenizer's length), got {tokens!r}")
        if confidence_threshold is not None and not 0 <= confidence_threshold <= 1:
            raise ValueError(f"confidence_threshold must be in [0, 1] or None, got {confidence_threshold!r}")
        self.confidence_threshold = confidence_threshold
        if isinstance(model, Runner):  # already a runner, e.g. specrepro.engines.lean.LeanRunner
            self.runner = model
            self.model = getattr(model, "model", None)
            self.vocab_size = model.vocab_size
            self.context_window = model.context_window
        else:
            self.model = model
            self.runner = default_runner(model)
            self.vocab_size = vocab_size(model)
            self.context_window = context_window(model)
        if tokens is not None and tokens > self.vocab_size:
            raise ValueError(f"the tokenizer has {tokens} tokens but the draft model only {self.vocab_size} rows")
        self.real_tokens = tokens
        self.rows = self.vocab_size  # the model's own vocabulary (vocab_size becomes the target's in fit_vocab)
        self.tokens = torch.empty(0, dtype=torch.long)

    def fit_vocab(self, target_vocab: int) -> None:
        """Give p rows over the target's `target_vocab` columns when the two vocabularies differ only in
        padding rows (Qwen2.5-0.5B has 151936, Qwen2.5-7B 152064, one tokenizer of 151665 tokens), as HF
        assisted generation does for such pairs: the draft's real tokens keep their probabilities, every
        other column gets p = 0. p stays the distribution the draft samples from, so verification is exact.
        """
        if target_vocab == self.vocab_size:
            return
        if self.real_tokens is None:
            raise ValueError(
                f"draft and target vocabularies differ ({self.vocab_size} vs {target_vocab} tokens): the draft must "
                "use the target's tokenizer; if it does and the two differ only in padding rows, give the "
                "tokenizer's length (ModelDraft(model, tokens=len(tokenizer)))")
        if self.real_tokens > target_vocab:
            raise ValueError(
                f"draft and target vocabularies differ: the draft's tokenizer has {self.real_tokens} tokens, more "
                f"than the target's {target_vocab}; the draft must use the target's tokenizer")
        self.vocab_size = target_vocab

    def _check_feed(self, feed: torch.Tensor) -> None:
        """A target padded beyond the draft's rows could emit a padding id the draft cannot embed."""
        if self.rows < self.vocab_size and int(feed.max()) >= self.rows:
            raise ValueError(f"the target produced token {int(feed.max())}, a padding row beyond the draft's "
                             f"{self.rows}: the draft cannot read it")

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's logits over vocab_size columns, -inf on padding (p = 0 there)."""
        n = self.real_tokens
        if n is None or (n == logits.shape[-1] == self.vocab_size):
            return logits
        out = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        out[..., :n] = logits[..., :n]
        return out

    def reset(self) -> None:
        super().reset()
        self.runner.reset()
        self.tokens = torch.empty(0, dtype=torch.long)

    def propose(self, seq, k, sampling, generator=None, target_hidden=None):
        seq = seq.to(self.runner.device)
        keep = min(common_prefix_length(self.tokens.to(seq.device), seq), seq.shape[0] - 1)
        self.runner.rollback(keep)
        feed = seq[keep:]
        self._check_feed(feed)
        if feed.shape[0] > 2 and hasattr(self.runner, "prefill"):  # a prompt: no LM head for its first tokens
            self.runner.prefill(feed[:-1])
            feed = feed[-1:]
        tokens, probs = [], []
        for _ in range(k):
            p = sampling.probs(self._fit(self.runner.forward(feed)[-1]))
            self.calls += 1
            if tokens and self.confidence_threshold is not None and float(p.max()) < self.confidence_threshold:
                # unsure: let the target decide from here; the last proposal has been fed already
                self.tokens = torch.cat([seq, torch.stack(tokens)])
                return torch.stack(tokens), torch.stack(probs)
            token = sample(p, generator)
            tokens.append(token)
            probs.append(p)
            feed = token.view(1)
        # the last proposal is not fed yet: the next call feeds it with the bonus token in one pass
        tokens = torch.stack(tokens)
        self.tokens = torch.cat([seq, tokens[:-1]])
        return tokens, torch.stack(probs)

    def propose_tree(self, seq, spec, sampling, generator=None, target_hidden=None, seed=None):
        """A token tree after seq (specrepro.drafts.growing.grow): one batched draft pass per level, each fed
        node attending to the context and its ancestors. The cache is rolled back to seq afterwards.
        confidence_threshold is not used: the tree's shape is set by its TreeSpec. seed: forced first
        children per path (a hybrid's lookup trie; see growing.grow)."""
        seq = seq.to(self.runner.device)
        n = seq.shape[0]
        keep = min(common_prefix_length(self.tokens.to(seq.device), seq), n - 1)
        self.runner.rollback(keep)
        feed = seq[keep:]
        self._check_feed(feed)
        if feed.shape[0] > 2 and hasattr(self.runner, "prefill"):
            self.runner.prefill(feed[:-1])
            feed = feed[-1:]
        root_logits = self._fit(self.runner.forward(feed)[-1])
        self.calls += 1
        fed: list[int] = []  # tree nodes in the draft cache after the context, in cache order

        def next_logits(tree, nodes):
            ids = torch.tensor([tree.tokens[i] for i in nodes], dtype=torch.long, device=seq.device)
            if len(nodes) == 1 and tree.path(nodes[0])[:-1] == fed:  # still a chain: the plain causal path (the same numbers as the chain draft's)
                logits = self.runner.forward(ids)
            else:
                positions = torch.tensor([n - 1 + tree.depths[i] for i in nodes], device=seq.device)
                mask = attention_mask(tree, n, nodes, fed)
                logits = self.runner.forward_tree(ids, positions, mask.to(seq.device))
            fed.extend(nodes)
            self.calls += 1
            return self._fit(logits)

        tree = grow(spec, sampling, generator, root_logits, next_logits, seed, self.children)
        self.runner.rollback(n)
        self.tokens = seq
        return tree


def default_runner(model):
    """How a model draft runs: on a CUDA device, a Llama-family model resident on one GPU runs in the
    static-shape runner with captured graphs (engines/static.py: a draft step of a small model is pure
    launch overhead in eager mode); on the CPU, a bfloat16 Llama-family model runs in the native pass where it
    is built here (engines/native.py: the target's own kernels, its cache and rollback, one C++ call per step
    instead of the HF model's dozens of torch ops); anything else in the HF runner."""
    from ..engines.lean import LeanRunner, is_llama_like
    from ..engines.runners import input_device, split_reason

    device = input_device(model)
    if not is_llama_like(model) or split_reason(model) is not None:
        return HFRunner(model)
    if device.type == "cuda":
        from ..engines.static import StaticRunner

        return StaticRunner(model, dtype=None)
    if device.type == "cpu" and next(model.parameters()).dtype == torch.bfloat16:
        from ..engines import native

        if native.unavailable_reason(torch.bfloat16, device) is None:
            return LeanRunner(model, dtype=torch.bfloat16, backend="native")
    return HFRunner(model)


def as_draft(draft) -> Draft:
    """A Draft as is; a causal LM (anything with get_output_embeddings) or a runner wrapped in ModelDraft."""
    if isinstance(draft, Draft):
        return draft
    if isinstance(draft, torch.nn.Module) and hasattr(draft, "get_output_embeddings"):
        return ModelDraft(draft)
    if isinstance(draft, Runner):  # HFRunner, LeanRunner, ...
        return ModelDraft(draft)
    raise TypeError(
        f"draft must be a Hugging Face causal LM, a runner or a specrepro.drafts.Draft, got {type(draft).__name__}"
    )
