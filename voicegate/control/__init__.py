"""The control plane: the aiohttp apps (one process's, and the pool's) and their routes."""
