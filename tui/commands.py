"""Command palette: every preset as 'Run preset NAME'."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from textual.command import DiscoveryHit, Hit, Hits, Provider

from ampscope.core import config as cfg

if TYPE_CHECKING:
    from ampscope.tui.app import AmpscopeApp


class PresetCommands(Provider):
    async def startup(self) -> None:
        read_only = getattr(self.app, "read_only", False)  # a served viewer starts nothing
        self.presets = [] if read_only else cfg.list_presets()

    def _command(self, name: str):
        app: AmpscopeApp = self.app  # type: ignore[assignment]
        return partial(app.run_preset_from_palette, name)

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
