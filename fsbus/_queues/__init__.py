"""Durable named queues: definitions, routing into per-queue stores, and consumers."""
