"""One export in its own process, so its peak memory is its own:
``python -m bench.export_runner {export,copy} TENANT_SLUG``.

Prints one JSON line: rows, bytes, seconds, peak_rss_mib (this process's
own peak, read from /proc/self/status as it finishes) and error, if the
export is not available.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from bench.peak import peak_rss_mib


class CountingSink:
    """A binary stream that keeps nothing: counts bytes and lines."""

    def __init__(self) -> None:
        self.bytes = 0
        self.lines = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        chunk = bytes(data)
        self.bytes += len(chunk)
        self.lines += chunk.count(b"\n")
        return len(chunk)

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return False


def _copy(tenant_slug: str, sink: CountingSink) -> None:
    import psycopg

    from bench.export_adapter import COPY_QUERY

    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        row = conn.execute("SELECT id FROM ledger_tenant WHERE slug = %s", [tenant_slug]).fetchone()
        assert row is not None
        query = COPY_QUERY.format(tenant_id=int(row[0]))
        with conn.cursor() as cursor, cursor.copy(f"COPY ({query}) TO STDOUT WITH CSV HEADER") as copy:
            for block in copy:
                sink.write(block)


def main() -> int:
    mode, tenant_slug = sys.argv[1], sys.argv[2]
    sink = CountingSink()
    result: dict[str, Any] = {"mode": mode}
    if mode == "export":
        import django

        django.setup()
        from bench.export_adapter import ExportUnavailable, stream_export

        began = time.perf_counter()
        try:
            result["entry_point"] = stream_export(tenant_slug, sink)  # type: ignore[arg-type]
        except ExportUnavailable as exc:
            result["error"] = str(exc)
    else:
        began = time.perf_counter()
        _copy(tenant_slug, sink)
    result.update(
        {
            "seconds": time.perf_counter() - began,
            "bytes": sink.bytes,
            "rows": max(0, sink.lines - 1),  # less the header
            "peak_rss_mib": peak_rss_mib(),
        }
    )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
