"""Runs of the ``okq`` command line (and of the AWS CLI) for the suite, each in a
process of its own, forked from a process that has already imported what every start
imports.

A start of ``okq`` spends most of its half second of CPU importing aiohttp,
pydantic, rich and okq's client, and the suite runs the command line a few
hundred times. :func:`run` hands a run to a fork server (one per test process,
started on first use): it has imported those modules and nothing of the command
line itself (``okq.cli`` and ``okq.commands`` read the environment when
imported: the terminal width, for one). For each run it forks, and the child
takes the caller's pipes as its stdin, stdout and stderr, the run's environment,
working directory and arguments, and runs ``okq.cli:main`` as the ``okq`` script
does, exiting with its status. So a run is still a process of its own with its
own exit code, output and signals (a timeout kills it); what it shares with the
others is only the modules imported before the fork.

A run whose environment could change how those modules import or how Python
sets up its streams (``OKQ_PURE``, ``PYTHON*``, ``AIOHTTP_*``, the locale) is
started as a fresh ``okq`` process instead, and so is every run when
``OKQ_TEST_CLI_FORKS=0`` (to check a failure is not the fork server's).

The AWS CLI (``python -m awscli``, the SQS API's tests) spends two thirds of its
0.6 s of CPU per run importing botocore and awscli: :func:`run` with ``program="aws"``
forks it the same way from a server of its own that has imported
``awscli.clidriver`` (nothing else: no session, no service model), and each run
calls its ``main`` as ``python -m awscli`` does. Importing awscli sets
``AWS_DATA_PATH`` (to its own data folder, after any given): each run's environment
gets what the server's imports set, and a run that sets ``AWS_DATA_PATH`` itself
starts fresh.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_SCRIPT = Path(sys.executable).with_name("okq")
#: The command line as a user starts it.
OKQ = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "okq.cli"]
#: What every start of the command line imports, and reads no environment when imported.
PRELOAD = ("aiohttp", "click", "pydantic", "rich.console", "rich.table", "okq.client",
           "okq.wire")
#: The AWS CLI as ``python -m awscli`` starts it.
AWS = [sys.executable, "-m", "awscli"]
#: Per program: the command it stands for, what its server imports, and its entry point.
PROGRAMS: dict[str, tuple[list[str], tuple[str, ...], str]] = {
    "okq": (OKQ, PRELOAD, "okq.cli"),
    "aws": (AWS, ("awscli.clidriver",), "awscli.clidriver"),
}
_IMPORT_ENV = ("OKQ_PURE", "PYTHON", "AIOHTTP_", "LANG", "LC_", "AWS_DATA_PATH")
#: What the fork server's imports set in its environment, set in each run's too.
_SET_BY_IMPORTS: dict[str, str] = {}

_servers: dict[str, dict[str, Any]] = {}
_lock = threading.Lock()


def run(args: Sequence[str], *, env: Mapping[str, str], input: str | bytes = "",
        timeout: float = 180, cwd: str | None = None, text: bool = True,
        program: str = "okq") -> subprocess.CompletedProcess[Any]:
    """``subprocess.run([*COMMAND, *args], capture_output=True, ...)``, forked; COMMAND
    is ``okq``, or ``python -m awscli`` for ``program="aws"``."""
    command = PROGRAMS[program][0]
    if os.environ.get("OKQ_TEST_CLI_FORKS") == "0" or any(
            k.startswith(_IMPORT_ENV) and env.get(k) != os.environ.get(k)
            for k in {*env, *os.environ}):
        return subprocess.run([*command, *args], input=input, capture_output=True, text=text,
                              timeout=timeout, env=dict(env), cwd=cwd)
    data = input.encode() if isinstance(input, str) else input
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    request = json.dumps({"args": list(args), "env": dict(env),
                          "cwd": cwd or os.getcwd()}).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(_socket_path(program))
        socket.send_fds(conn, [len(request).to_bytes(4, "big") + request], [in_r, out_w, err_w])
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    outs: dict[int, bytes] = {}

    def drain(fd: int) -> None:
        with open(fd, "rb") as f:
            outs[fd] = f.read()

    def feed() -> None:
        with open(in_w, "wb") as f, contextlib.suppress(BrokenPipeError):
            f.write(data)

    threads = [threading.Thread(target=drain, args=(fd,), daemon=True) for fd in (out_r, err_r)]
    threads.append(threading.Thread(target=feed, daemon=True))
    for t in threads:
        t.start()
    with conn, conn.makefile("r") as replies:
        pid = int(replies.readline())
        try:
            status = replies.readline()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            raise subprocess.TimeoutExpired([*command, *args], timeout) from None
    for t in threads:
        t.join()
    code = int(status)
    out, err = outs[out_r], outs[err_r]
    if text:
        return subprocess.CompletedProcess([*command, *args], code, out.decode(), err.decode())
    return subprocess.CompletedProcess([*command, *args], code, out, err)


def _socket_path(program: str) -> str:
    with _lock:
        server = _servers.setdefault(program, {})
        proc = server.get("proc")
        if proc is None or proc.poll() is not None:
            path = os.path.join(tempfile.mkdtemp(prefix="okq-cli-"), "forks.sock")
            proc = subprocess.Popen([sys.executable, "-m", "tests.cliforks", path, program],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, cwd=Path(__file__).parent.parent)
            assert proc.stderr is not None
            line = proc.stderr.readline()  # "ready" once it listens
            assert line == b"ready\n", line + proc.stderr.read()
            if not server:
                atexit.register(_stop, server)
            server.update(proc=proc, path=path)
        return str(server["path"])


def _stop(server: dict[str, Any]) -> None:
    proc = server.get("proc")
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the fork server -------------------------------------------------------------------------


def _serve(path: str, program: str) -> None:
    before = dict(os.environ)
    for name in PROGRAMS[program][1]:
        __import__(name)
    _SET_BY_IMPORTS.update((k, v) for k, v in os.environ.items() if before.get(k) != v)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(64)
    # The waiters are reaped here (their CPU, and their commands', counts as this
    # process's children's: the suite's CPU figures include the runs).
    signal.signal(signal.SIGCHLD, lambda *_: _reap())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    atexit.register(_reap, True)
    sys.stderr.write("ready\n")
    sys.stderr.flush()
    parent = os.getppid()
    srv.settimeout(1.0)  # to notice a test process that ended without stopping it
    while True:
        try:
            conn, _ = srv.accept()  # blocking, as the listening socket's timeout is not inherited
        except TimeoutError:
            if os.getppid() != parent:  # an xdist worker ended without running atexit
                sys.exit(0)
            continue
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        size = int.from_bytes(msg[:4], "big")
        msg = msg[4:]
        while len(msg) < size:
            msg += conn.recv(size - len(msg))
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:  # the waiter: runs the command in a child and reports its status
            srv.close()
            _wait(conn, json.loads(msg), fds, program)
        conn.close()
        for fd in fds:
            os.close(fd)


def _reap(all_: bool = False) -> None:
    """Reap the waiters that have exited (``all_``: wait for every one)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if all_ else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _wait(conn: socket.socket, req: dict[str, Any], fds: list[int], program: str) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    atexit.unregister(_reap)  # the server's, not its commands
    pid = os.fork()
    if pid == 0:
        conn.close()
        _child(req, fds, program)
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        conn.sendall(f"{code}\n".encode())
    finally:
        os._exit(0)


def _child(req: dict[str, Any], fds: list[int], program: str) -> None:
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(req["env"])
        os.environ.update(_SET_BY_IMPORTS)
        os.chdir(req["cwd"])
        entry = importlib.import_module(PROGRAMS[program][2])
        if program == "okq":
            sys.argv = [str(_SCRIPT), *req["args"]]
            script = types.ModuleType("__main__")  # as the okq script's (click names the
            script.__file__ = str(_SCRIPT)          # program by it: "Usage: okq ...")
            sys.modules["__main__"] = script
        else:  # python -m awscli: its __main__ exits with main()'s return
            sys.argv = [str(Path(entry.__file__).with_name("__main__.py")), *req["args"]]
        try:
            code = entry.main() or 0
        except SystemExit as exc:  # as the interpreter exits on one
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:  # as the interpreter prints one that ends it
            traceback.print_exc()
        atexit._run_exitfuncs()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])
