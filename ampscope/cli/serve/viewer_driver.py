"""The served viewer's driver: textual's web driver, for a browser that may send anything and
a server that may vanish.

- a resize to what is not a terminal size (text, 1e308, 100000 columns) is not acted on:
  ``ampscope serve`` checks every message already, this is the viewer's own guard;
- the end of its input (``ampscope serve``'s end of the pipe closed: serve is gone) ends the
  viewer, where the web driver would keep drawing for nobody.
"""

from __future__ import annotations

from textual.drivers.web_driver import WebDriver

from ampscope.cli.serve.messages import BadMessage, terminal_size
from ampscope.cli.serve.viewer_exit import leave_soon


class ViewerDriver(WebDriver):
    def on_meta(self, packet_type: str, payload: dict[str, object]) -> None:
        if packet_type == "resize":
            try:
                width, height = terminal_size(payload)
            except BadMessage:
                return
            payload = {**payload, "width": width, "height": height}
        super().on_meta(packet_type, payload)

    def run_input_thread(self) -> None:
        super().run_input_thread()
        if not self.exit_event.is_set():  # the input ended, not the app
            leave_soon()
