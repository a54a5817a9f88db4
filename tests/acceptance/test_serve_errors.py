"""``okq serve`` that cannot start: one clear line and exit status 1, every time.

Against a bucket that does not exist (moto's server), ``okq serve`` ended with
SIGABRT (status 134) in about one run in twenty with obstore: the error path
let the interpreter finalise while obstore's native threads ran
(``okq.store.exit_past_native_threads``); with aioboto3 it left the store's
HTTP session unclosed ("Unclosed client session"). Each run here registers an
atexit hook: the error path must leave without finalising the interpreter once
obstore ran, which is what prevents the abort whatever the thread timing.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.s3

#: ``okq`` with a sign of the interpreter finalising.
ENTRY = ("import atexit, runpy, sys; "
         "atexit.register(lambda: print('interpreter finalised', file=sys.stderr)); "
         "sys.argv[0] = 'okq'; runpy.run_module('okq.cli', run_name='__main__')")


@pytest.mark.parametrize("client", ["obstore", "aioboto3"])
def test_serve_against_a_missing_bucket_exits_1_with_one_clear_line(
        client: str, moto_endpoint: str) -> None:
    argv = [sys.executable, "-c", ENTRY, "serve", "--store", "s3://okq-missing-bucket/p",
            "--endpoint-url", moto_endpoint, "--port", "0", "--s3-client", client,
            "--log-level", "WARNING", "--signing-keys", "serve-errors-key-0123456789"]
    runs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    try:
        errs = [run.communicate(timeout=60)[1] for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.communicate()
    for run, err in zip(runs, errs, strict=True):
        assert run.returncode == 1, err
        lines = [line for line in err.strip().splitlines() if line != "interpreter finalised"]
        assert lines[-1].startswith(
            "Error: no bucket 'okq-missing-bucket': S3 404 NoSuchBucket ("), err
        assert lines[-1].endswith("create it, or check the store URL and the endpoint"), err
        assert "Unclosed" not in err and "Debug source" not in err, err
        if client == "obstore":
            assert "interpreter finalised" not in err, err
