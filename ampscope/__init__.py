"""ampscope: watch how a number format and torch.compile mode change a training run.

The package is layered, bottom to top:

- ``ampscope.core``: presets, events, records and analyses; imports neither torch nor textual;
- ``ampscope.engine`` (trains, torch) and ``ampscope.tui`` (draws, textual), side by side;
- ``ampscope.cli``: the command lines, the only code that reaches both.

Importing ``ampscope`` loads none of torch and textual.
"""

__version__ = "0.1.0"
