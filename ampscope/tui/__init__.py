"""The ampscope dashboard (Textual). Never imports torch or the engine package."""
