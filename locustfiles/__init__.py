"""Locust user classes, load shape and listeners for streaming LLM load tests."""
