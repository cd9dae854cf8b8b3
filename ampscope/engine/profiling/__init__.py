"""Where the step goes: torch.profiler over a few steps, asked for and otherwise never run."""

from ampscope.engine.profiling.control import ProfileControl, no_phase

__all__ = ["ProfileControl", "no_phase"]
