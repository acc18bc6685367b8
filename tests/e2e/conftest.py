"""Fixtures shared by the end-to-end tests."""

from reward_service import service  # noqa: F401 (the reward.url service, a fixture)
