"""A real TLS-terminating nginx in front of web processes, for end-to-end tests.

The test writes a self-signed certificate (``openssl``) and an nginx config under a tmp
dir and runs nginx in the foreground on free loopback ports: one ``server`` per upstream,
TLS terminated there, ``X-Forwarded-Proto: https`` and the client's ``Host`` passed on
(or another, as a proxy that rewrites it),
no buffering (streams pass through as they are written). nginx connects to the web from
127.0.0.2, so the web's uvicorn (which trusts proxy headers from 127.0.0.1 only, as
deployed) sees what it sees behind an ingress on another address: a plain-http request
whose scheme only Django's settings can tell.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

from tests.workers import free_port

SERVER = """
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {dir}/cert.pem;
        ssl_certificate_key {dir}/key.pem;
        location / {{
            proxy_pass http://127.0.0.1:{upstream};
            proxy_bind 127.0.0.2;
            proxy_http_version 1.1;
            proxy_set_header Host {host};
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_buffering off;
            proxy_read_timeout 120s;
        }}
    }}
"""

CONFIG = """
{user}worker_processes 1;
pid {dir}/nginx.pid;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
{servers}
}}
"""


def nginx_path() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None)


def self_signed_cert(directory: Path) -> Path:
    """cert.pem and key.pem for 127.0.0.1 (valid a day); returns the certificate's path."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(directory / "key.pem"), "-out", str(directory / "cert.pem")],
        check=True, capture_output=True)
    return directory / "cert.pem"


class TlsProxy:
    """nginx terminating TLS on one free port per upstream port: ``url(upstream)``."""

    def __init__(self, directory: Path, upstreams: list[int],
                 ports: dict[int, int] | None = None,
                 hosts: dict[int, str] | None = None) -> None:
        """``ports``: the listening port of an upstream chosen ahead (its public origin);
        ``hosts``: the Host an upstream is sent (default ``$http_host``, the client's)."""
        self.dir = directory
        self.cert = self_signed_cert(directory)
        self.ports = {up: (ports or {}).get(up) or free_port() for up in upstreams}
        servers = "".join(SERVER.format(port=p, upstream=up, dir=directory,
                                        host=(hosts or {}).get(up, "$http_host"))
                          for up, p in self.ports.items())
        user = "user root root;\n" if os.geteuid() == 0 else ""  # tmp dirs are the test's
        (directory / "nginx.conf").write_text(CONFIG.format(user=user, dir=directory,
                                                            servers=servers))
        self.log_path = directory / "error.log"
        self.proc = subprocess.Popen(
            [nginx_path(), "-p", str(directory), "-c", str(directory / "nginx.conf"),
             "-e", str(self.log_path), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def url(self, upstream: int) -> str:
        return f"https://127.0.0.1:{self.ports[upstream]}"

    def wait_ready(self, timeout: float = 15.0) -> None:
        context = ssl.create_default_context(cafile=str(self.cert))
        deadline = time.monotonic() + timeout
        pending = set(self.ports.values())
        while pending and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited:\n{self.log_tail()}")
            for port in list(pending):
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1) as raw, \
                            context.wrap_socket(raw, server_hostname="127.0.0.1"):
                        pending.discard(port)
                except OSError:
                    time.sleep(0.1)
        if pending:
            raise TimeoutError(f"nginx not listening on {sorted(pending)}:\n{self.log_tail()}")

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() \
            else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: workers finish, then exit
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
