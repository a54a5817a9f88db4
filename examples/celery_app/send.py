"""Sends tasks to the worker of ``tasks.py`` through okq and prints their results."""

from __future__ import annotations

from tasks import flaky_square, word_count

if __name__ == "__main__":
    counts = [word_count.delay(text) for text in ("one", "two words", "and three words")]
    squares = [flaky_square.delay(n) for n in range(1, 4)]
    print("word counts:", [r.get(timeout=60) for r in counts])
    print("squares:", [r.get(timeout=60) for r in squares])
