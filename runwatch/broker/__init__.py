"""Broker tooling (composition root): a real Kafka broker for tests, CI and users."""
