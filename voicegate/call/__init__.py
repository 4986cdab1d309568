"""The per-call task: one live call's session, the effects it carries out, and the agent's control.

``transfer.py`` is a call's blind transfer. Later: ``legs.py`` (a second leg of a bridged or
consulted transfer).
"""
