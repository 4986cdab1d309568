"""docs/events.md, made from the code so that it cannot drift: :func:`render_events`.

``scripts/update_event_reference.py`` writes the page; tests/unit/test_event_reference.py fails
when it is not what this module makes. Each event type of :mod:`session.events` gets its fields
(the dataclass's, with the comments beside them), when it is written (its docstring: every event
class must have one), the signaling states where :data:`session.machine.TRANSITIONS` takes it and
what happens elsewhere, and the effect kinds its handler may return. Those effects are read from
the source, not from a run (:func:`effects_of`): every ``fx.<Effect>(...)`` call in the handler
and in each function of ``session/`` it calls, at any depth. That is an upper bound (a kind
listed needs some path through the code; a kind not listed is never carried), and
tests/unit/test_session_properties.py checks it against the steps of its random sessions.

Pure: the standard library and ``session`` only (the layer rule, tests/unit/test_layers.py).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import importlib
import inspect
import io
import json
import re
import textwrap
import tokenize
import typing
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from session import effects as fx
from session import events as ev
from session import machine
from session.errors import IllegalTransition
from session.state import Signaling

# Every effect type, in the order session/effects.py declares them (its exhaustive union).
EFFECTS: tuple[type[fx.Effect], ...] = typing.get_args(fx.AnyEffect)

_Function = Callable[..., Any]


# --- reading the code ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reach:
    """What a function of ``session/`` may do, by its source and its callees' (at any depth)."""

    effects: frozenset[type[fx.Effect]]  # every effect type it, or a callee, constructs
    callees: tuple[_Function, ...]  # the functions of session/ it calls that construct any
    refusals: tuple[str, ...]  # the reasons its IllegalTransition raises give (its callees' too)


def effects_of(function: _Function) -> tuple[type[fx.Effect], ...]:
    """The effect types ``function`` may return, in :data:`EFFECTS` order."""
    found = reach(function).effects
    return tuple(e for e in EFFECTS if e in found)


def reach(function: _Function) -> Reach:
    return _reach(function, frozenset())


@functools.cache
def _reach(function: _Function, visiting: frozenset[_Function]) -> Reach:
    own_effects, calls, own_refusals = _scan(function)
    effects = set(own_effects)
    refusals = list(own_refusals)
    callees: list[_Function] = []
    for callee in calls:
        if callee in visiting:
            continue  # a cycle: its effects are counted where it started
        inner = _reach(callee, visiting | {function})
        effects |= inner.effects
        refusals += inner.refusals
        if inner.effects and callee not in callees:
            callees.append(callee)
    return Reach(frozenset(effects), tuple(callees), tuple(dict.fromkeys(refusals)))


@functools.cache
def _scan(
    function: _Function,
) -> tuple[frozenset[type[fx.Effect]], tuple[_Function, ...], tuple[str, ...]]:
    """The effect types ``function``'s own source constructs, the functions of ``session/`` it
    calls (in source order), and the reasons of the IllegalTransitions it raises."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    names = function.__globals__
    effects: set[type[fx.Effect]] = set()
    calls: list[_Function] = []
    refusals: list[tuple[int, str]] = []
    assigned = sorted(
        (
            (node.lineno, target.id, node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        ),
        key=lambda a: a[0],
    )
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            raised = _resolve(node.exc.func, names)
            refuses = isinstance(raised, type) and issubclass(raised, IllegalTransition)
            if refuses and len(node.exc.args) >= 3:  # (state, event, why)
                why = node.exc.args[2]
                if isinstance(why, ast.Name):  # ``why = f"..."`` a line or two before
                    earlier = [
                        v for line, name, v in assigned if name == why.id and line < node.lineno
                    ]
                    why = earlier[-1] if earlier else why
                refusals.append((node.lineno, _text_of(why)))
        if not isinstance(node, ast.Call):
            continue
        target = _resolve(node.func, names)
        if isinstance(target, type) and issubclass(target, fx.Effect) and target is not fx.Effect:
            effects.add(target)
        elif (
            inspect.isfunction(target)
            and target.__module__.startswith("session.")
            and target not in calls
        ):
            calls.append(target)
    # Source order, so that the page lists callees as the code reads.
    calls.sort(key=lambda f: _position(tree, f, names))
    return frozenset(effects), tuple(calls), tuple(why for _, why in sorted(refusals))


def _position(tree: ast.AST, function: _Function, names: dict[str, Any]) -> tuple[int, int]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _resolve(node.func, names) is function:
            return (node.lineno, node.col_offset)
    return (0, 0)


def _resolve(node: ast.expr, names: dict[str, Any]) -> object:
    """What a called name (``f``, ``module.f``) is in the module whose globals are ``names``."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        owner = names.get(node.value.id)
        if isinstance(owner, ModuleType):
            return getattr(owner, node.attr, None)
    return None


def _text_of(node: ast.expr) -> str:
    """A refusal's reason as written: a string, or an f-string with ``…`` for what it fills in."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            part.value if isinstance(part, ast.Constant) and isinstance(part.value, str) else "…"
            for part in node.values
        )
    return "…"


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    type: str
    default: str  # as JSON, the log's form; "" when required
    note: str  # the comments beside it in the source


def fields_of(cls: type) -> list[Field]:
    """``cls``'s dataclass fields, with the comments written on or just above each."""
    comments = _field_comments(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = _json(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = _json(f.default_factory())
        else:
            default = ""
        out.append(Field(f.name, str(f.type), default, comments.get(f.name, "")))
    return out


def _json(value: object) -> str:
    if isinstance(value, tuple):
        value = list(value)
    return json.dumps(value)


def _field_comments(cls: type) -> dict[str, str]:
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(token.start[0])
    notes: dict[str, str] = {}
    (node,) = ast.parse(source).body
    assert isinstance(node, ast.ClassDef)
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        parts: list[str] = []
        line = item.lineno - 1
        while line in comments and line not in code_lines:  # a comment block just above
            parts.insert(0, comments[line])
            line -= 1
        if item.end_lineno in comments:  # and one at the end of its line
            parts.append(comments[item.end_lineno])
        if parts:
            notes[item.target.id] = " ".join(parts)
    return notes


def docstring_of(cls: type) -> str:
    """``cls``'s own docstring (not the one ``dataclass`` makes up from its signature)."""
    (node,) = ast.parse(textwrap.dedent(inspect.getsource(cls))).body
    assert isinstance(node, ast.ClassDef)
    doc = ast.get_docstring(node)
    if not doc:
        module = inspect.getmodule(cls)
        where = module.__name__ if module else "?"
        raise ValueError(f"{where}.{cls.__name__} has no docstring: say when it is written")
    return doc


def event_groups() -> list[tuple[str, list[type[ev.Event]]]]:
    """session/events.py's event classes in source order, under its ``# --- name ---`` headings."""
    groups: list[tuple[str, list[type[ev.Event]]]] = []
    for line in inspect.getsource(ev).splitlines():
        if heading := re.match(r"# --- (.+?) -+$", line):
            groups.append((heading.group(1), []))
        elif cls := re.match(r"class (\w+)\(Event\):", line):
            groups[-1][1].append(getattr(ev, cls.group(1)))
    listed = [cls for _, classes in groups for cls in classes]
    if sorted(c.type for c in listed) != sorted(ev.EVENT_TYPES):
        raise ValueError("session/events.py: its classes and EVENT_TYPES differ")
    return groups


# --- writing the page ---------------------------------------------------------------------------


def _anchor(name: str) -> str:
    return f"[`{name}`](#{name})"


_EVENT_CLASSES = {cls.__name__: cls for cls in ev.EVENT_TYPES.values()}
_EFFECT_CLASSES = {cls.__name__: cls for cls in EFFECTS}


def _linked(name: str) -> str | None:
    """A link to the section of the event or effect class ``name``, if it is one."""
    if name in _EVENT_CLASSES:
        return _anchor(_EVENT_CLASSES[name].type)
    if name in _EFFECT_CLASSES:
        return _anchor(_EFFECT_CLASSES[name].kind)
    return None


def _values(path: str) -> str:
    """The values of ``session.x.Name`` when it is an enum or a tuple of names, else ""."""
    if not path.startswith("session."):
        return ""
    module_name, _, attr = path.rpartition(".")
    try:
        value = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError):
        return ""
    if isinstance(value, type) and issubclass(value, enum.Enum):
        items = [str(member.value) for member in value]
    elif isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        items = list(value)
    else:
        return ""
    return " (" + ", ".join(f"`{v}`" for v in items) + ")"


def markdown(doc: str) -> str:
    """A docstring in Markdown: paragraphs on one line each, reST roles and literals as code."""

    def role(m: re.Match[str]) -> str:
        path = m.group(2)
        name = path.rsplit(".", 1)[-1] if m.group(1) else path
        short = path.rsplit(".", 1)[-1]
        return _linked(short) or f"`{name}`{_values(path)}"

    def literal(m: re.Match[str]) -> str:
        return _linked(m.group(1)) or f"`{m.group(1)}`"

    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", doc.strip())]
    text = "\n\n".join(paragraphs)
    text = re.sub(r":(?:class|data|func|mod|meth|attr):`(~?)([\w.]+)`", role, text)
    return re.sub(r"``(.+?)``", literal, text)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _qualified(function: _Function) -> str:
    return f"{function.__module__}.{function.__name__}"


def _kinds(effects: Collection[type[fx.Effect]]) -> str:
    ordered = [e for e in EFFECTS if e in effects]
    return ", ".join(_anchor(e.kind) for e in ordered) if ordered else "none"


def _states(states: frozenset[Signaling]) -> str:
    if states == frozenset(Signaling):
        return "every state"
    return ", ".join(f"`{s.value}`" for s in Signaling if s in states)


def _fields_table(fields: list[Field], *, required: str) -> Iterator[str]:
    if not fields:
        yield "No fields."
        return
    notes = any(f.note for f in fields)
    yield "| field | type | default |" + (" note |" if notes else "")
    yield "| --- | --- | --- |" + (" --- |" if notes else "")
    for f in fields:
        cells = [f"`{f.name}`", f"`{f.type}`", f"`{f.default}`" if f.default else required]
        if notes:
            cells.append(markdown(f.note))
        yield "| " + " | ".join(_cell(c) for c in cells) + " |"


def _elsewhere(rule: machine.Rule[Any]) -> str:
    if isinstance(rule.elsewhere, machine.Ignore):
        return (
            f'ignored as stale ("{rule.elsewhere.why}"): a '
            f"{_anchor(fx.StaleEventIgnored.kind)} effect, nothing logged"
        )
    return f'refused ("{rule.elsewhere.why}")'


def _event_section(cls: type[ev.Event]) -> Iterator[str]:
    rule = machine.TRANSITIONS[cls]
    found = reach(rule.handler)
    yield f"### `{cls.type}`"
    yield ""
    yield f"`{cls.__name__}`. {markdown(docstring_of(cls))}"
    yield ""
    yield from _fields_table(fields_of(cls), required="required")
    yield ""
    yield f"- **Taken in:** {_states(rule.legal_in)}."
    if rule.legal_in != frozenset(Signaling):
        yield f"- **Elsewhere:** {_elsewhere(rule)}."
    if found.refusals:
        reasons = "; ".join(f'"{r}"' for r in found.refusals)
        yield f"- **May be refused there too:** {_cell(reasons)}."
    yield f"- **Effects it may carry:** {_kinds(found.effects)}."
    via = [f"`{_qualified(f)}`" for f in found.callees]
    handler = f"`{_qualified(rule.handler)}`"
    yield f"- **Handler:** {handler}" + (f", through {', '.join(via)}." if via else ".")
    yield ""


def _effect_section(
    cls: type[fx.Effect],
    in_process: Collection[type[fx.Effect]],
    carried_by: list[type[ev.Event]],
) -> Iterator[str]:
    yield f"### `{cls.kind}`"
    yield ""
    runs = (
        "at once (it changes only this process's memory)"
        if cls in in_process
        else "once its step is durable"
    )
    yield f"`{cls.__name__}`. {markdown(docstring_of(cls))} Runs {runs}."
    yield ""
    yield from _fields_table(fields_of(cls), required="(required)")
    yield ""
    events = ", ".join(_anchor(e.type) for e in carried_by) if carried_by else "none"
    yield f"Carried by: {events}."
    yield ""


def _helpers() -> list[_Function]:
    """Every function of ``session/`` a handler reaches that constructs an effect, by module."""
    seen: dict[_Function, None] = {}

    def visit(function: _Function) -> None:
        for callee in reach(function).callees:
            if callee not in seen:
                seen[callee] = None
                visit(callee)

    for rule in machine.TRANSITIONS.values():
        visit(rule.handler)
    handlers = {rule.handler for rule in machine.TRANSITIONS.values()}
    return sorted(
        (f for f in seen if f not in handlers),
        key=lambda f: (f.__module__, inspect.getsourcelines(f)[1]),
    )


INTRO = """\
# Session events

<!-- generated by session.event_reference.render_events() (scripts/update_event_reference.py);
tests/unit/test_event_reference.py keeps it in step: edit session/events.py, not this page -->

A session is its log of events: everything that happened to it (a call offered, media lost, a
turn, a tool call's receipt, a timer come due) as plain values (`session/events.py`). The runtime
feeds each one to the state machine (`session.machine.step`), which returns the new state and
the effects to carry out (`session/effects.py`). The step, the event with its effects, is
appended to the session's log *before* its effects run: an effect that reaches outside the process
(the caller, the agent, a tool provider, the SIP peer) runs only once that append is durable;
those that change only the process's memory run at once ([effects](#effects) says which;
`voicegate/call/acting.py`). The state is the fold of the log, from scratch or from a checkpoint
(`session/durable.py`), so a session is rebuilt from its events after a crash.

**Where to read them.** `GET /v1/sessions/{id}` ([api.md](api.md)) answers with `events`, the
whole log: each entry's `seq` (from 1), `type` (one of the types below; `EventType` in
[openapi.yaml](openapi.yaml) names them), `at` (the session clock), `payload` (the event's fields
below, as JSON) and `effects` (each `{"kind": ..., ...its fields}`). `GET /v1/sessions` gives each
session's count.

**Names.** A type is its stable name in stored logs: renaming one breaks old logs, so new names
are added instead. Every field has a default, so an entry written before a field existed still
reads; an unknown type or field is refused (`session.events.event_from_dict`).

**Where an event is taken.** Each type has one rule in `session.machine.TRANSITIONS`: the
signaling states it is taken in (*taken in*) and what happens in the others (*elsewhere*):

- *refused*: `IllegalTransition` with the reason given; nothing changes and nothing is logged;
- *ignored as stale*: the state is unchanged, the step's one effect is `stale_event_ignored`
  (counted), and nothing is logged.

Whatever the rule, an event is refused before the offer (signaling `none`: "the call has not been
offered") unless its rule takes it there; a refusing rule's event is refused in `away` and
`dropped` with a reason saying only a return or an ending applies; and every event is refused
once the session has ended (`SessionTerminated`). A handler may refuse an event in its states too,
for what its fields or the state say: *may be refused there too* quotes the reasons its code (and
the code it calls) gives, `…` standing for what a reason fills in.

**How the effects are found.** They are read from the code, not from a run: every
`fx.<Effect>(...)` in the event's handler and in each function of `session/` it calls, at any
depth (`session.event_reference.effects_of`). So the list is an upper bound: every kind listed
appears on some path through that code, but a path may need conditions that never meet (the
ending sequence, `session.ending.terminate`, says something and hangs up only when someone is on
the line, which an ending after the caller left never has); a kind not listed is never carried.
The kinds are listed in `session/effects.py`'s order; a step lists its own in the order to carry
them out.
`tests/unit/test_session_properties.py` checks the bound on every step of its random sessions.
*Through* names the functions of `session/` the handler calls that bring effects in;
[the shared functions](#the-functions-the-handlers-share) lists what each may bring.
"""


def render_events(*, in_process: Collection[type[fx.Effect]]) -> str:
    """docs/events.md. ``in_process``: the effect types the runtime runs before their step is
    durable (voicegate/call/executor.py's ``IN_PROCESS``; passed in, since session/ does not
    import voicegate/)."""
    groups = event_groups()
    kinds = [e.kind for e in EFFECTS]
    if len(set(kinds)) != len(kinds) or set(kinds) & set(ev.EVENT_TYPES):
        raise ValueError("effect kinds and event types must be distinct (they are anchors)")
    lines = [INTRO]
    lines += ["## Events", ""]
    for name, classes in groups:
        lines.append(f"- {name}: " + ", ".join(_anchor(c.type) for c in classes))
    lines.append("")
    for name, classes in groups:
        lines += [f"## {name[0].upper()}{name[1:]}", ""]
        for cls in classes:
            lines += _event_section(cls)
    carried: dict[type[fx.Effect], list[type[ev.Event]]] = {e: [] for e in EFFECTS}
    for _, classes in groups:
        for cls in classes:
            for effect in effects_of(machine.TRANSITIONS[cls].handler):
                carried[effect].append(cls)
            rule = machine.TRANSITIONS[cls]
            stale = carried[fx.StaleEventIgnored]
            if isinstance(rule.elsewhere, machine.Ignore) and cls not in stale:
                stale.append(cls)
    lines += [
        "## Effects",
        "",
        "What a step asks the runtime to do, in the order the step lists them "
        "(`voicegate/call/executor.py` carries each out). *Carried by*: the event types whose "
        "step may list it (as above, an upper bound).",
        "",
    ]
    for effect in EFFECTS:
        lines += _effect_section(effect, in_process, carried[effect])
    lines += [
        "## The functions the handlers share",
        "",
        "The functions of `session/` that handlers call and that bring effects in, by module, "
        "each with the effects it may bring (its callees' included) and the functions it brings "
        "them through.",
        "",
        "| function | what it does | effects | through |",
        "| --- | --- | --- | --- |",
    ]
    for function in _helpers():
        found = reach(function)
        doc = inspect.getdoc(function) or ""
        summary = markdown(doc.split("\n\n", 1)[0]) if doc else ""
        via = ", ".join(f"`{_qualified(f)}`" for f in found.callees)
        cells = [f"`{_qualified(function)}`", summary, _kinds(found.effects), via]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines).rstrip() + "\n"
