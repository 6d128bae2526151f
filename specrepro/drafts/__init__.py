"""Draft strategies for speculative_generate, the table of draft kinds, and `load` for trained drafts
(specrepro.training makes their artifacts; loading one never imports it)."""
from .artifacts import load
from .base import Draft, ModelDraft, as_draft
from .datastore import Datastore, DatastoreDraft
from .feature import FeatureDraft
from .heads import HeadsDraft
from .hybrid import HybridDraft
from .kinds import FREE_KINDS, KINDS
from .lookup import LookupDraft
from .truncated import TruncatedDraft, truncated_model
from .small import SmallDraft

__all__ = [
    "Draft", "ModelDraft", "as_draft", "LookupDraft", "Datastore", "DatastoreDraft", "TruncatedDraft", "truncated_model",
    "SmallDraft", "FeatureDraft", "HeadsDraft", "HybridDraft", "KINDS", "FREE_KINDS", "load",
]
