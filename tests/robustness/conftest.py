from tests.integration.conftest import server, server_factory  # noqa: F401  (the same fixtures)
