"""``python -m ledgerdash.replicas NAME --port N``: serve one provider's replica."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from ledgerdash.replicas import REPLICAS, replica
from ledgerdash.replicas.core import ReplicaServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ledgerdash.replicas", description="Serve a provider's replica.")
    parser.add_argument("provider", choices=sorted(REPLICAS))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    server = ReplicaServer((args.host, args.port), replica(args.provider), verbose=args.verbose)

    def stop(_signum: int, _frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"{args.provider} replica on http://{args.host}:{server.server_port}/", flush=True)
    server.serve_forever()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
