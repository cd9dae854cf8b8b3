"""The front-ends: every command line (``ampscope ...``), each in a module named after its
command, and in serve/ the dashboard served to browsers (``ampscope serve``) with its viewers.

The only code that reaches both the engine and the dashboard.
"""
