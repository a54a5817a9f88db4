"""The fault campaign's short form, its scenarios on the fleet without the sequencer
(``name@direct``: every node takes lease decisions by its own clock); the others run
in test_campaign.py, on another of the suite's workers at the same time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.test_campaign import DIRECT, run_short_campaign

pytestmark = pytest.mark.s3


@pytest.mark.timeout(600)
def test_short_campaign_without_the_sequencer_loses_nothing(tmp_path: Path) -> None:
    run_short_campaign(tmp_path, DIRECT)
