"""Reference tool providers: real HTTP peers that voicegate calls as tools (STYLE.md habit 9).

Each provider is its own small service with its own storage, started as a separate process
(``python -m providers.<name>``). They do not import voicegate: they are the other side of the
contract, written to it, so a change in voicegate cannot quietly bend them.
"""
