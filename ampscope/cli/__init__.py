"""The front-ends: every command line (``ampscope ...``) and the served viewer's entry.

The only code that reaches both the engine and the dashboard.
"""
