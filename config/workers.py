"""What one worker of a pool serves: its SIP port, RTP range, control port and name.

With ``pool.workers == 1`` the one worker is the whole server and serves the settings as given.
With more, Kamailio owns ``sip.address:sip.port`` and the supervisor owns ``http``; worker ``i``
gets ``pool.worker_sip_port + i`` on ``pool.worker_address``, the ``i``-th equal slice of the RTP
range, a loopback control port, and the name ``<pool_name>.<i>`` (so a restarted worker finds
exactly its own predecessor's sessions): ``node.name`` for a node of a cluster (unique among the
nodes, so are its workers'), else ``session.worker_name``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from config.settings import Settings

WORKER_HTTP_ADDRESS = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    index: int
    name: str
    sip_address: str
    sip_port: int
    http_port: int
    rtp_port_min: int
    rtp_port_max: int

    @property
    def sip_uri(self) -> str:
        host = f"[{self.sip_address}]" if ":" in self.sip_address else self.sip_address
        return f"sip:{host}:{self.sip_port}"

    @property
    def control_url(self) -> str:
        return f"http://{WORKER_HTTP_ADDRESS}:{self.http_port}"


def pool_name(settings: Settings) -> str:
    """What the pool's process names start with: the node's name in a cluster."""
    return settings.node.name or settings.session.worker_name


def worker_slots(settings: Settings) -> list[WorkerSlot]:
    pool, media = settings.pool, settings.media
    if pool.workers == 1:
        return [
            WorkerSlot(
                0,
                settings.session.worker_name,
                settings.sip.address,
                settings.sip.port,
                settings.http.port,
                media.rtp_port_min,
                media.rtp_port_max,
            )
        ]
    # Even-sized, even-aligned slices: RTP on an even port, RTCP on the next (RFC 3550 11).
    width = (media.rtp_port_max - media.rtp_port_min + 1) // pool.workers
    width -= width % 2
    slots = []
    for i in range(pool.workers):
        low = media.rtp_port_min + i * width
        slots.append(
            WorkerSlot(
                i,
                f"{pool_name(settings)}.{i}",
                pool.worker_address,
                pool.worker_sip_port + i,
                pool.worker_http_port + i,
                low,
                low + width - 1,
            )
        )
    return slots


def worker_settings(settings: Settings, index: int) -> Settings:
    """The settings worker ``index`` runs with (unchanged for a one-worker pool)."""
    if settings.pool.workers == 1:
        if index != 0:
            raise ValueError(f"worker {index} of a one-worker pool")
        return settings
    slot = worker_slots(settings)[index]
    return dataclasses.replace(
        settings,
        sip=dataclasses.replace(settings.sip, address=slot.sip_address, port=slot.sip_port),
        media=dataclasses.replace(
            settings.media, rtp_port_min=slot.rtp_port_min, rtp_port_max=slot.rtp_port_max
        ),
        http=dataclasses.replace(settings.http, address=WORKER_HTTP_ADDRESS, port=slot.http_port),
        session=dataclasses.replace(settings.session, worker_name=slot.name),
    )
