"""The governor: releases tasks from per-domain frontier queues into `fetch.ready` with a permit."""
