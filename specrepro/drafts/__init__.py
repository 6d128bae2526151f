"""Draft strategies for speculative_generate."""
from .base import Draft, ModelDraft, as_draft
from .lookup import LookupDraft, TruncatedDraft, truncated_model

__all__ = ["Draft", "LookupDraft", "ModelDraft", "TruncatedDraft", "as_draft", "truncated_model"]
