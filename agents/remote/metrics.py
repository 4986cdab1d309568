"""The metrics the remote agent client counts, as a protocol: what it needs, not whose they are.

``agents`` sits below ``voicegate`` (ARCHITECTURE.md, "Layout": dependencies point one way), so
the client must not import ``voicegate.observe.metrics``. It names here the handful of
prometheus-client metrics it touches, with exactly the calls it makes on them
(``.labels(...).inc()``, ``.dec()``); ``voicegate.observe.metrics.Metrics`` satisfies
:class:`RemoteAgentMetrics` structurally and the runtime injects it
(``RemoteAgentFactory(settings, metrics)``). The label values are the ones ``Metrics`` declares.
"""

from __future__ import annotations

from typing import Protocol


class CounterChild(Protocol):
    """One labelled series of a counter."""

    def inc(self, amount: float = 1) -> None: ...


class GaugeChild(Protocol):
    """One labelled series of a gauge."""

    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...


class LabelledCounter(Protocol):
    def labels(self, *labelvalues: str) -> CounterChild: ...


class LabelledGauge(Protocol):
    def labels(self, *labelvalues: str) -> GaugeChild: ...


class RemoteAgentMetrics(Protocol):
    """The series agents/remote/ writes (read-only members, so a plain attribute satisfies them)."""

    @property
    def agent_links(self) -> LabelledGauge:
        """``voicegate_agent_links{state}``: links by state (link.py)."""
        ...

    @property
    def agent_link_resumes(self) -> LabelledCounter:
        """``voicegate_agent_link_resumes_total{result}`` (link.py, dial.py)."""
        ...

    @property
    def agent_replayed_messages(self) -> LabelledCounter:
        """``voicegate_agent_replayed_messages_total{direction}`` (link.py)."""
        ...

    @property
    def agent_protocol_errors(self) -> LabelledCounter:
        """``voicegate_agent_protocol_errors_total{kind}`` (link.py)."""
        ...

    @property
    def agent_chunks_dropped(self) -> LabelledCounter:
        """``voicegate_agent_chunks_dropped_total{reason}`` (adapter.py)."""
        ...

    @property
    def tool_duplicates_prevented(self) -> LabelledCounter:
        """``voicegate_tool_duplicates_prevented_total{tool}`` (adapter.py)."""
        ...


__all__ = [
    "CounterChild",
    "GaugeChild",
    "LabelledCounter",
    "LabelledGauge",
    "RemoteAgentMetrics",
]
