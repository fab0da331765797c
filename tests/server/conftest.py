"""The fixture every compile-service test starts from: an app on a temporary store, run through
Starlette's TestClient with its lifespan (so its worker processes start and stop with the test)."""

import pytest
from starlette.testclient import TestClient

from server.app import create_app


@pytest.fixture
def serve(tmp_path):
    """`serve(**create_app kwargs)` gives a started TestClient on a fresh store (tmp_path/var unless
    store_dir is given); every client is closed, and its workers stopped, after the test."""
    clients = []

    def start(**options) -> TestClient:
        raise_errors = options.pop("raise_errors", True)
        options.setdefault("store_dir", tmp_path / "var")
        options.setdefault("max_workers", 2)
        client = TestClient(create_app(**options), raise_server_exceptions=raise_errors)
        client.__enter__()
        clients.append(client)
        return client

    yield start
    for client in reversed(clients):
        client.__exit__(None, None, None)
