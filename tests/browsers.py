"""Whether the browser tests may skip: Debian's Chromium is needed (Playwright cannot download a
browser here); where CI requires it, its absence fails the test instead of skipping it."""

import os

import pytest

from nblib.publish import browse

# set by .ci/run (CI=true by most CI services): there a missing browser fails the browser tests
# instead of skipping them, so the site and lab checks cannot silently stop running
MUST_BROWSE = "NBLIB_REQUIRE_BROWSER"


def browser_required():
    return os.environ.get(MUST_BROWSE) == "1" or os.environ.get("CI", "").lower() in ("1", "true")


def chromium_or_skip():
    """Skip without Chromium, or fail when the browser is required here."""
    if browse.CHROMIUM.exists():
        return
    why = f"{browse.CHROMIUM} is absent (apt-get install -y chromium)"
    if browser_required():
        pytest.fail(f"{why}: {MUST_BROWSE}=1 or CI requires the browser check")
    pytest.skip(why)
