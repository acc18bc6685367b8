"""The error raised for a bad config: its message names the key and the fix."""


class ConfigError(ValueError):
    """A config value or combination that cannot run."""
