"""A local S3-compatible server for the tests: moto in server mode on 127.0.0.1, started as a process.

The fixture sets the standard AWS variables (``AWS_ENDPOINT_URL``, test credentials, region) in this
process's environment, so the storage layer, and Ray workers started after it, reach the server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from tests.ports import free_port

ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@contextmanager
def moto_server() -> Iterator[str]:
    """Start moto's S3 server; yields its endpoint URL with the AWS variables set; stops it by PID."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in (*ENV, "AWS_ENDPOINT_URL")}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start (exit {proc.poll()})") from None
                time.sleep(0.2)
        os.environ.update(ENV)
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        yield endpoint
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def new_bucket() -> str:
    """A fresh, empty bucket: ``s3://tm-<random>``."""
    from pipeline import storage

    name = f"tm-{uuid.uuid4().hex[:12]}"
    fs, _ = storage.filesystem(f"s3://{name}")
    fs.create_dir(name)
    return f"s3://{name}"
