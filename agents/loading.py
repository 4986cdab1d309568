"""Your own agent, found by its import path (``agent.kind = "python"``, ``agent.factory``).

The factory is imported and checked once, at start-up, so that a typo or a missing dependency
stops the server with a message naming the key and the fix, instead of failing the first caller.
It must be an :class:`agents.base.Agent` subclass, or a callable taking ``(context, call)``; a
callable's return value is checked on each call (voicegate/call/agent_guard.py).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from agents.base import Agent, AgentFactory

KEY = "agent.factory"


class AgentLoadError(ValueError):
    """The factory cannot be used; the message names the key, the value and the fix."""


def load_factory(path: str) -> AgentFactory:
    """The factory at ``path`` (``package.module:name``), or :class:`AgentLoadError`."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise AgentLoadError(f'{KEY} = "{path}": expected "package.module:name"')
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise AgentLoadError(
                f'{KEY} = "{path}": no module named {exc.name!r} (is it installed, or on '
                "PYTHONPATH?)"
            ) from None
        raise AgentLoadError(
            f'{KEY} = "{path}": importing {module_name!r} failed: it needs the module '
            f"{exc.name!r}, which is not installed"
        ) from None
    except Exception as exc:
        raise AgentLoadError(
            f'{KEY} = "{path}": importing {module_name!r} failed: {type(exc).__name__}: {exc}'
        ) from None
    found: Any = module
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise AgentLoadError(
                f'{KEY} = "{path}": module {module_name!r} has no attribute {attribute!r}'
            ) from None
    _check(path, found)
    factory: AgentFactory = found
    return factory


def _check(path: str, found: object) -> None:
    if inspect.isclass(found):
        if not issubclass(found, Agent):
            raise AgentLoadError(
                f'{KEY} = "{path}": {found.__name__} is a class but not an agents.base.Agent '
                "subclass"
            )
    elif not callable(found):
        raise AgentLoadError(
            f'{KEY} = "{path}": {type(found).__name__} is not callable: give an Agent subclass '
            "or a function factory(context, call)"
        )
    try:
        signature = inspect.signature(found)
    except (TypeError, ValueError):
        return  # a builtin or extension callable without a signature: checked on first call
    try:
        signature.bind(object(), object())
    except TypeError:
        raise AgentLoadError(
            f'{KEY} = "{path}": it must accept (context, call), but its signature is {signature}'
        ) from None
