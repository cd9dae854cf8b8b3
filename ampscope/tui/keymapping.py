"""The dashboard's keys as the user set them: ``keys.toml`` applied to every screen's
bindings (clashes refused and said), and a dimmed key, pressed, saying why it does nothing.

A mixin of the app, apart from the screen stack and the run manager in ``ampscope.tui.app``.
"""

from __future__ import annotations

from textual import events
from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from ampscope.core.text import visible
from ampscope.tui import keys
from ampscope.tui.screens.help import key_reason


class Keymapping(App):
    SCREENS_WITH_KEYS: tuple[type[Screen], ...] = ()
    """Every screen whose bindings ``keys.toml`` may remap."""

    def tell(self, message: str, *, error: bool = False, title: str = "") -> None:
        raise NotImplementedError

    @classmethod
    def binding_ids(cls) -> set[str]:
        found = set()
        for owner in (cls, *cls.SCREENS_WITH_KEYS):
            for binding in owner.BINDINGS:
                if isinstance(binding, Binding) and binding.id:
                    found.add(binding.id)
        return found

    def load_keys(self) -> list[str]:
        """The user's keys (``keys.toml``) set; what is wrong with the file, for the caller to
        say once (``tell_keys_problems``) where it will be seen.

        Without the file, nothing is loaded: the screens' own keys apply, and the screens
        not shown yet are not loaded to learn their bindings."""
        path = keys.keys_path()
        if not path.exists():
            return []
        keymap, problems = keys.load_keymap(path, self.binding_ids())
        keymap, clashes = keys.drop_clashes(keymap, type(self), self.SCREENS_WITH_KEYS)
        if keymap:
            self.set_keymap(keymap)
        return problems + clashes

    def tell_keys_problems(self, problems: list[str]) -> None:
        for problem in problems:
            self.tell(problem, error=True, title="Keys")

    def handle_bindings_clash(self, clashed_bindings: set[Binding], node: object) -> None:
        names = ", ".join(sorted({b.id or b.action for b in clashed_bindings}))
        if names and names != getattr(self, "_clash_told", ""):
            self._clash_told = names
            self.tell(
                f"{keys.keys_path()} gives a key to more than one binding here; these lost it: "
                f"{names}.",
                error=True,
                title="Keys",
            )

    def on_key(self, event: events.Key) -> None:
        """A dimmed key, pressed, says why it does nothing now, rather than nothing at all."""
        active = self.screen.active_bindings.get(event.key)
        if active is None or active.enabled:
            return
        action = active.binding.action.partition("(")[0]
        note = key_reason(self.screen, action)
        if note:
            message = f"{active.binding.description}: {note}"
            self.notify(visible(message), title="Not now", markup=False, timeout=4)
