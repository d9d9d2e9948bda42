"""What the frontier's former per-domain queues leave on a broker, for the tests of their retirement.

Before the frontier was sharded, the governor declared a queue `frontier.d.<domain>` for each
domain it saw and recorded it in the namespace's `domains` stream, which the topology no
longer declares.
"""

from __future__ import annotations

from hutch.amqp import Broker, declare_queue
from hutch.models import DomainRecord
from hutch.topology import Topology

REGISTRY_ARGUMENTS = {"x-queue-type": "stream", "x-max-length-bytes": 256 * 1024 * 1024}


async def leave_domain_queue(broker: Broker, topology: Topology, domain: str) -> str:
    """Declare `domain`'s queue and record it in the `domains` stream, as the old governor did."""
    channel = await broker.channel()
    try:
        name: str = (await declare_queue(channel, topology.domain_queue(domain))).name
        await channel.declare_queue(topology.domains, durable=True, arguments=REGISTRY_ARGUMENTS)
        await broker.publish("", topology.domains, DomainRecord(domain=domain))
        return name
    finally:
        await channel.close()
