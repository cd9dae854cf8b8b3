"""ampscope: watch how a number format and torch.compile mode change a training run.

This package holds what the training engine (``engine/``) and the dashboard (``tui/``)
both need: preset loading and validation, the event schema and run records. It imports
neither torch nor textual.
"""

__version__ = "0.1.0"
