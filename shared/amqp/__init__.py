"""Hutch's one thin AMQP layer, on aio-pika: connect, declare, publish, consume, RPC.

Three rules live here so no service has to remember them:

- Publishing goes through `Broker.publish` only: publisher confirms, `mandatory`, a
  timeout, a unique `message_id`, trace context in the headers; a nack, a return or a
  timeout raises `PublishFailed`. A caller that gets no exception knows the broker has it.
- Handlers never ack. `Broker.consume` wraps a handler: it decodes the body into its model
  (inflated first when its `content_encoding` says it was compressed, see `hutch.compression`;
  undecodable, over-size or of an unknown encoding -> dead letter with reason `decode`), runs
  the handler inside a consumer span, and then acks when it returns and dead-letters on
  `Dead`. The handler publishes what it produced before it returns, so a message is acked
  only after its successors are confirmed (at-least-once).
- Every message ends, whatever fails. Two counts travel in its headers, because `redelivered`
  says only that some consumer once held it, not how often:
  - `x-hutch-crashes`: a delivery flagged `redelivered` means a consumer died holding it (or
    its channel closed). A process killed by a message cannot count anything itself, so the
    next consumer republishes the message with the count raised, acks the redelivery and
    lets the fresh copy be handled; at `max_crashes` it is dead (`crashed`) with its stage.
  - `x-hutch-failures`: an exception from the handler (an error that belongs to the message)
    republishes it with the count raised; at `max_failures` it is dead (`error`).
  Both republish and ack instead of nack-requeue, so `redelivered` keeps its meaning. A dead
  Page keeps its page, so a replay re-parses without a re-fetch.
- Errors of the infrastructure (`Requeue`, a failed publish, a lost channel) spend nothing:
  the message waits a short backoff (growing with each such error in a row on that
  consumer, at most `INFRA_BACKOFF_MAX`) and is republished with its counts unchanged. When
  even that publish fails the message is nack-requeued, and the broker's redelivery then
  counts as one crash: one reason `max_crashes` is more than 1.
- Connections are robust: after a broker restart aio-pika reopens channels and redeclares
  every exchange, queue and binding declared through them, and each consumer subscribes again
  on the reopened channel.

The hot path sits on aiormq, the library under aio-pika, where aio-pika's conveniences cost
more than the work: publishes build their properties and pipeline on the channel, consumers
subscribe on the channel and get a small `Delivery`, and every connection writes the frames of
one loop iteration with one `send`. Measured in docs/benchmarks.md (permits per second).
"""

from hutch.amqp.broker import (
    INFRA_BACKOFF_FIRST,
    INFRA_BACKOFF_MAX,
    Broker,
    BrokerUnreachable,
    Dead,
    PublishFailed,
    Requeue,
    declare_queue,
    infra_backoff,
    queue_depth,
    topology_for,
)
from hutch.amqp.consumer import CRASHES, FAILURES, Consumer, Delivery, Handler, copy_properties, message_type
from hutch.amqp.rpc import RpcClient, serve_rpc

__all__ = [
    "CRASHES",
    "FAILURES",
    "INFRA_BACKOFF_FIRST",
    "INFRA_BACKOFF_MAX",
    "Broker",
    "BrokerUnreachable",
    "Consumer",
    "Dead",
    "Delivery",
    "Handler",
    "PublishFailed",
    "Requeue",
    "RpcClient",
    "copy_properties",
    "declare_queue",
    "infra_backoff",
    "message_type",
    "queue_depth",
    "serve_rpc",
    "topology_for",
]
