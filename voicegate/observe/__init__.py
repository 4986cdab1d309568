"""What an SRE sees: Prometheus metrics (one process's and the pool's) and structured logs."""
