"""The page ``ampscope serve`` gives browsers, made to work offline.

textual-serve's page loads its font from fonts.googleapis.com, which a GPU box behind a
firewall (and the browsers of a lecture room on its network) often cannot reach. The same
font ships with textual-serve in its static folder: the page is rewritten at serve time to
load it from there. Nothing of textual-serve is copied into ampscope: its installed template
is read, the one link replaced, and the result served from a temporary folder.
"""

from __future__ import annotations

import re
from pathlib import Path

REMOTE_FONT = re.compile(r"<link\b[^>]*fonts\.googleapis\.com[^>]*>", re.IGNORECASE | re.DOTALL)
FONT_FILES = {
    "normal": "RobotoMono-VariableFont_wght.ttf",
    "italic": "RobotoMono-Italic-VariableFont_wght.ttf",
}


def local_font_css() -> str:
    """@font-face rules for the font textual-serve ships (a Jinja template: its static URL)."""
    static = "{{ config.static.url }}"
    faces = "".join(
        f'@font-face {{ font-family: "Roboto Mono"; font-style: {style}; '
        f'src: url("{static}fonts/{name}") format("truetype"); }}'
        for style, name in FONT_FILES.items()
    )
    return f"<style>{faces}</style>"


def offline_page(html: str) -> str:
    """``html`` with its remote font link replaced by the locally served font."""
    return REMOTE_FONT.sub(lambda _m: local_font_css(), html)


def offline_templates(folder: Path, source: Path | None = None) -> Path:
    """textual-serve's templates, rewritten by ``offline_page``, in ``folder``."""
    if source is None:
        import textual_serve

        source = Path(textual_serve.__file__).parent / "templates"
    folder.mkdir(parents=True, exist_ok=True)
    for template in source.iterdir():
        if template.is_file():
            (folder / template.name).write_text(offline_page(template.read_text()))
    return folder
