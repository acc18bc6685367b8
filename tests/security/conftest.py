"""Shared by the security tests: the sandbox must be isolated here (or the test skips)."""

from __future__ import annotations

import os

import pytest

from rlsys.rewards.sandbox import sandbox_support


@pytest.fixture(scope="module")
def isolated():
    support = sandbox_support()
    assert support.runs, support.reason
    if not support.isolated:
        if os.geteuid() == 0:
            pytest.fail(f"running as root, yet the sandbox is not isolated: {support.reason}")
        pytest.skip(
            f"no namespaces for a non-root user here: {support.reason}; run the tests as root, "
            "or allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1)"
        )
    return support
