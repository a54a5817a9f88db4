#!/usr/bin/env bash
# A two-stage pipeline of shell commands with `okq work`, against a running node
# (OKQ_URL, default http://127.0.0.1:7878; OKQ_API_KEY if the node wants one).
#
#   urls  --(curl-like fetch: here `wc -c`)-->  sizes  --(a check)-->  checked
#
# Stage one turns each line of text into its length; stage two fails on a length
# above 20 (exit 1), so that item is retried and then dead-lettered after the
# queue's max attempts. Every stdout line of a command becomes an item of the next
# queue in the same step as the completion: nothing is lost or produced twice if a
# worker is killed in between. Each run makes queues of its own (a suffix).
#
#   okq serve &                 # in another shell, or any node
#   bash examples/shell_pipeline.sh
set -euo pipefail
okq="${OKQ:-okq}"
run=$(date +%s)-$$   # this run's queues: lines-RUN, sizes-RUN, ...

$okq queues create "lines-$run" >/dev/null
$okq queues create "sizes-dead-$run" >/dev/null
$okq queues create "sizes-$run" --max-attempts 2 --dead-queue "sizes-dead-$run" >/dev/null
$okq queues create "checked-$run" >/dev/null

printf '%s\n' "short" "a little longer" "much, much, much longer than that" |
    $okq produce "lines-$run"

# Stage one: every item's payload is the command's stdin; its stdout, the next item.
$okq work -q "lines-$run" -Q "sizes-$run" --limit 3 -- sh -c 'wc -c | tr -d " "'
# Stage two: exit 1 retries (a backoff of 0.1 s), until max attempts dead-letters it.
$okq work -q "sizes-$run" -Q "checked-$run" --limit 3 --backoff 0.1 -- \
    sh -c 'read n; if [ "$n" -gt 20 ]; then echo "too long: $n" >&2; exit 1; fi; echo "ok $n"'

echo "checked:"
$okq items "checked-$run"
echo "dead letters:"
$okq dead list "sizes-dead-$run"
