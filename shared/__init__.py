"""Hutch: a scraping job system of small services that talk only through RabbitMQ.

This package is the repository's `shared/` folder: the pieces every service uses
(settings, message models, the topology, the one AMQP layer, telemetry, the store).
The services themselves live in `hutch.services` (the repository's `services/`).
"""

__version__ = "0.1.0"
