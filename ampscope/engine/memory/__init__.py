"""Memory measured on a real model, for ``ampscope memory``: the measuring half of the
memory plan, whose formulas are ``core/memory``.

saved.py  what autograd saves for a user's model, per regime
"""
