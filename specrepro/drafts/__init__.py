"""Draft strategies for speculative_generate."""
from .base import Draft, ModelDraft, as_draft

__all__ = ["Draft", "ModelDraft", "as_draft"]
