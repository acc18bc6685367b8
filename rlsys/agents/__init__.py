"""Agents written against the OpenAI API (``task.env.name=openai_agent``): an
OpenAI-compatible endpoint over the rollout pool with one session per trajectory (server.py,
session.py), the runner that trains on what the sessions recorded (runner.py, stitch.py) and
example agents (examples.py). See docs/environments.md."""
