"""llama.cpp's rpc-server (built by `make setup` into build/rpc-server/bin/) on loopback ports.

    with RpcServer.start() as srv:            # 127.0.0.1, a free port, 1 thread
        srv.endpoint                          # '127.0.0.1:PORT'

Readiness is checked by connecting and closing at once (the server then waits for the next
client); every wait has a timeout; stop() kills the process and reaps it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
SERVER_BIN = REPO / "build" / "rpc-server" / "bin" / "rpc-server"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcServer:
    def __init__(self, proc: subprocess.Popen, port: int, cache_root: Path | None):
        self.proc, self.port, self.cache_root = proc, port, cache_root
        self.endpoint = f"127.0.0.1:{port}"

    @classmethod
    def start(cls, *, cache_root: Path | None = None, threads: int = 1,
              timeout_s: float = 20.0) -> "RpcServer":
        """cache_root: turn the server's -c cache on, in <cache_root>/rpc (via LLAMA_CACHE)."""
        if not SERVER_BIN.is_file():
            raise FileNotFoundError(f"{SERVER_BIN} is missing: run `make setup` "
                                    f"(tools/build_rpc_server.sh builds it)")
        env = dict(os.environ)
        args = [str(SERVER_BIN), "-H", "127.0.0.1", "-t", str(threads)]
        if cache_root is not None:
            env["LLAMA_CACHE"] = str(cache_root)
            args.append("-c")
        for _ in range(5):                     # a free port may be taken before we bind it
            port = free_port()
            proc = subprocess.Popen(args + ["-p", str(port)], env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            srv = cls(proc, port, cache_root)
            if srv._wait_ready(timeout_s):
                return srv
            srv.stop()
        raise RuntimeError(f"rpc-server did not start listening within {timeout_s} s")

    def _wait_ready(self, timeout_s: float) -> bool:
        t_end = time.monotonic() + timeout_s
        while time.monotonic() < t_end:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                return True
            except OSError:
                time.sleep(0.05)
        return False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def pause(self) -> None:
        """SIGSTOP: the server keeps its socket but stops answering."""
        self.proc.send_signal(signal.SIGSTOP)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
