import dataclasses

import pytest

from specrepro.tasks.sandbox import containment, sandbox_info


@pytest.fixture
def fallback(monkeypatch):
    """This machine's sandbox with no namespaces (and so no private root): the fallback level, forced."""
    reduced = dataclasses.replace(sandbox_info(), namespaces=False, unshare=None, private_dirs=False, visible=())
    monkeypatch.setattr(containment, "sandbox_info", lambda: reduced)
    monkeypatch.delenv(containment.MODE_VARIABLE, raising=False)
    return reduced
