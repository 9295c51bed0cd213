"""loadmaster backend: the headless library behind the console (never imports Textual)."""

__version__ = "0.1.0"
