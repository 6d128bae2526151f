"""What makes draft artifacts: the data the target writes (corpus, distillation passes, shards, the datastore
build), the trainers (a short `train`, the long resumable `longrun`), their losses, tau cards and the
`specrepro-drafts train` command. specrepro.drafts loads what these make and never imports this package."""
from .trainer import train

__all__ = ["train"]
