"""The worker pool: the supervisor, restart backoff, and the Kamailio front door."""
