"""Times without a zone are UTC (okq/clock.py), for the API and the CLI alike."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from okq.clock import assume_utc


def test_a_time_without_a_zone_is_utc_and_one_with_a_zone_keeps_it() -> None:
    assert assume_utc(datetime(2026, 1, 2, 3, 4)) == datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
    paris = datetime(2026, 1, 2, 4, 4, tzinfo=timezone(timedelta(hours=1)))
    assert assume_utc(paris) is paris
    assert assume_utc(paris).timestamp() == datetime(2026, 1, 2, 3, 4, tzinfo=UTC).timestamp()
