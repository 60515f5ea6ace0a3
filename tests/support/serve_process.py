"""`pyggml serve` as a child process on a free loopback port; every wait is bounded.

    with ServeProcess(["-m", model, "-np", "2"]) as srv:
        httpx.get(f"{srv.base}/health")
    srv.stderr                                # what it printed, after it stopped
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx

PYGGML = [sys.executable, "-m", "pyggml.cli"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    def __init__(self, args: list[str], ready_timeout_s: float = 120.0):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.args, self.ready_timeout_s, self.stderr = args, ready_timeout_s, ""

    def __enter__(self) -> "ServeProcess":
        self.proc = subprocess.Popen(PYGGML + ["serve", "--port", str(self.port)] + self.args,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=ENV)
        t_end = time.monotonic() + self.ready_timeout_s
        while True:
            try:
                if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > t_end:
                self.__exit__(None, None, None)
                raise RuntimeError(f"pyggml serve did not come up: {self.stderr[-2000:]}")
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.stderr = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
