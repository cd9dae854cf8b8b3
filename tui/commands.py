"""Command palette: every preset as 'Run preset NAME'."""

from __future__ import annotations

from collections.abc import Callable

from textual.command import DiscoveryHit, Hit, Hits, Provider

from ampscope.core import config as cfg
from ampscope.tui.messages import RunRequested


class PresetCommands(Provider):
    async def startup(self) -> None:
        read_only = getattr(self.app, "read_only", False)  # a served viewer starts nothing
        self.presets = [] if read_only else cfg.list_presets()

    def _command(self, name: str) -> Callable[[], object]:
        return lambda: self.app.post_message(RunRequested(name))

    async def discover(self) -> Hits:
        for info in self.presets:
            yield DiscoveryHit(
                f"Run preset {info.name}", self._command(info.name), help=info.description
            )

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for info in self.presets:
            text = f"Run preset {info.name}"
            score = matcher.match(text)
            if score > 0:
                yield Hit(
                    score,
                    matcher.highlight(text),
                    self._command(info.name),
                    text=text,
                    help=info.description,
                )
