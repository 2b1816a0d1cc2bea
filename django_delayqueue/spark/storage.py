"""Where the Spark jobs read and write: paths and URIs kept as given, joined as strings.

``hdfs://nn:8020/x``, ``s3a://bucket/shop`` and ``file:///data`` must reach Spark unchanged
(``pathlib`` would turn ``s3a://bucket`` into ``s3a:/bucket``). What Spark writes goes there
directly; what the driver writes itself (the report's summary, CSV tables and charts) goes
through Hadoop's FileSystem API, the same one Spark uses, so both land on the same storage
whatever it is. On a cluster that storage must be one the driver and every executor share.
"""

from __future__ import annotations

import re
from typing import Any

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def has_scheme(path: str) -> bool:
    """Whether ``path`` is a URI (``hdfs://...``, ``file:/...``) rather than a plain path."""
    return bool(_SCHEME.match(path)) and not re.match(r"^[A-Za-z]:[\\/]", path)


def join(base: str, *parts: str) -> str:
    """``base`` with ``parts`` appended, separated by single slashes; the scheme is kept."""
    out = base if base.endswith("://") else base.rstrip("/")
    for part in parts:
        part = part.strip("/")
        if part:
            out = f"{out}{part}" if out.endswith("/") else f"{out}/{part}"
    return out


def is_local_master(master: str) -> bool:
    """``local``, ``local[4]``, ``local[*]``...: driver and executors are one process."""
    return master == "local" or master.startswith("local[")


def _hadoop_path(spark: Any, uri: str) -> tuple[Any, Any]:
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return path, path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())


def write_bytes(spark: Any, uri: str, data: bytes) -> str:
    """Write ``data`` to ``uri`` (replacing it) through Hadoop's FileSystem; returns ``uri``."""
    path, fs = _hadoop_path(spark, uri)
    # No ".name.crc" file beside each one on a local disk (Hadoop's LocalFileSystem default).
    fs.setWriteChecksum(False)
    stream = fs.create(path, True)
    try:
        stream.write(bytearray(data))
    finally:
        stream.close()
    return uri


def write_text(spark: Any, uri: str, text: str) -> str:
    return write_bytes(spark, uri, text.encode("utf-8"))


def read_bytes(spark: Any, uri: str) -> bytes:
    """The content of ``uri`` through Hadoop's FileSystem (for tests and small files)."""
    path, fs = _hadoop_path(spark, uri)
    stream = fs.open(path)
    try:
        out = bytearray()
        buffer = spark.sparkContext._gateway.new_array(spark.sparkContext._jvm.byte, 65536)
        while (n := stream.read(buffer)) > 0:
            out += bytes(buffer)[:n]
        return bytes(out)
    finally:
        stream.close()


def exists(spark: Any, uri: str) -> bool:
    path, fs = _hadoop_path(spark, uri)
    return bool(fs.exists(path))
