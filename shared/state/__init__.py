"""Shared state: a local Redis for one-machine runs and tests (redis_server), and the store over it (store)."""
