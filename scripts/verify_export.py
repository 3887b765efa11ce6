#!/usr/bin/env python3
"""Verify a ledgerdash audit export offline: python verify_export.py EXPORT.csv|EXPORT.ndjson

Needs only the standard library and the rfc8785 package (pip install rfc8785);
not ledgerdash, not its database. For each tenant in the file it recomputes
every event row's content hash from its fields (sha256 of the RFC 8785 JSON
of tenant_id, attempt_id, kind, actor_kind, actor_user_id, actor_label,
from_state, to_state, fence, reason, details, created_at) and each link
(hash = sha256(prev_hash bytes + content_hash bytes)), then:

- a full export (or a filtered one with link rows) must run from seq 1 to
  the head row's seq without a gap and end on the head's hash: the rows are
  the whole chain up to that head, unmodified;
- a filtered export without link rows can only show each row is unmodified
  relative to the hashes it carries, and that neighbouring rows link up.

A tenant whose events are kept in several chains (the export row's
details.chains names each such tenant and how many) has a head row per
chain: chain c holds seqs c+1, c+1+N, c+1+2N, ... and each chain is
walked on its own, as above, from its first seq to its head.

--known-head TENANT:SEQ:HASH (repeatable) checks the chain still passes
through a head you kept from an earlier export or from verify_audit.
Exit status 0 when everything checked holds (what the file proves is
printed), 1 otherwise: then every problem is printed as BROKEN and nothing
in the file is said to be verified, since rows past a broken one may rest
on it.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import sys
from collections.abc import Iterator
from typing import Any

import rfc8785

GENESIS = "0" * 64
INT_COLUMNS = ("tenant_id", "attempt_id", "actor_user_id", "fence", "event_seq", "event_id")


def records(path: str) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8", newline="") as handle:
        first = handle.read(1)
        handle.seek(0)
        if first == "{":
            for line in handle:
                if line.strip():
                    yield json.loads(line)
            return
        for row in csv.DictReader(handle):
            # Undo the export's formula neutralization: it prefixes a quote to
            # every cell that starts with = + - @ tab, CR or a quote.
            cells = {k: (v[1:] if v.startswith("'") else v) for k, v in row.items()}
            for name in INT_COLUMNS:
                cells[name] = int(cells[name]) if cells[name] else None
            cells["details"] = json.loads(cells["details"]) if cells["details"] else None
            yield cells


def content_hash(row: dict[str, Any]) -> str:
    content = {
        "tenant_id": row["tenant_id"],
        "attempt_id": row["attempt_id"],
        "kind": row["event_kind"],
        "actor_kind": row["actor_kind"],
        "actor_user_id": row["actor_user_id"],
        "actor_label": row["actor_label"],
        "from_state": row["from_state"],
        "to_state": row["to_state"],
        "fence": row["fence"],
        "reason": row["reason"],
        "details": row["details"],
        "created_at": row["event_at"],
    }
    return hashlib.sha256(rfc8785.dumps(content)).hexdigest()


def link(prev_hash: str, content: str) -> str:
    return hashlib.sha256(bytes.fromhex(prev_hash) + bytes.fromhex(content)).hexdigest()


def verify(path: str, known_heads: dict[tuple[str, int], str]) -> tuple[list[str], list[str]]:
    """The problems found (empty when everything holds) and what the file
    proves; the caller states what it proves only when nothing is broken."""
    problems: list[str] = []
    proven: list[str] = []
    state: dict[tuple[str, int], dict[str, Any]] = {}
    chains: dict[str, int] = {}
    walkable = True
    for row in records(path):
        kind, tenant = row["record"], row["tenant"]
        if kind == "export":
            print(f"export by {row['actor_label']} at {row['event_at']}: {json.dumps(row['details'])}")
            walkable = row["details"]["scope"] != "filtered"
            chains = row["details"].get("chains", {})
            continue
        n = chains.get(tenant, 1)
        # A head row names its chain; an event's seq does.
        stripe = row["details"].get("chain", 0) if kind == "head" else (row["event_seq"] - 1) % n
        t = state.setdefault((tenant, stripe), {"seq": 0, "hash": GENESIS, "whole": walkable, "events": 0, "links": 0})
        whose = tenant if n == 1 else f"{tenant} chain {stripe}"
        if kind == "head":
            counted = {"events": t["events"], "links": t["links"]} | ({"chain": stripe} if n > 1 else {})
            if row["details"] != counted:
                problems.append(f"{whose}: the head row counts {row['details']}, the file has {counted}")
            if not walkable:
                head = f"head seq {row['event_seq']} {row['hash']}"
                proven.append(f"{whose}: {t['events']} rows unmodified and linked to their neighbours; a filtered")
                proven.append(f"  export without link rows cannot prove completeness ({head})")
            elif (t["seq"], t["hash"]) != (row["event_seq"], row["hash"]):
                problems.append(f"{whose}: the rows end at seq {t['seq']}, not at the head (seq {row['event_seq']})")
            elif t["whole"] and n == 1:
                proven.append(f"{whose}: VERIFIED seq 1..{t['seq']}, complete and unmodified up to head {row['hash']}")
            elif t["whole"]:
                proven.append(
                    f"{whose}: VERIFIED seq {stripe + 1}..{t['seq']} every {n}, complete and unmodified up to"
                    f" head {row['hash']}"
                )
            t["done"] = True
            continue
        seq, name = row["event_seq"], f"{tenant} seq {row['event_seq']} (event id {row['event_id']})"
        expected = t["seq"] + n if t["seq"] else stripe + 1
        if kind == "event":
            t["events"] += 1
            if content_hash(row) != row["content_hash"]:
                problems.append(f"{name}: edited, its fields do not match its content hash")
            belongs = (row["attempt_id"] or 0) % n
            if belongs != stripe:
                problems.append(f"{name}: sits in chain {stripe}, but its attempt's events belong to chain {belongs}")
        else:
            t["links"] += 1
        if link(row["prev_hash"], row["content_hash"]) != row["hash"]:
            problems.append(f"{name}: edited, its hash is not link(prev_hash, content_hash)")
        if seq == expected and row["prev_hash"] != t["hash"]:
            problems.append(f"{name}: does not follow seq {t['seq']} (missing, replaced or reordered)")
        elif seq <= t["seq"]:
            problems.append(f"{name}: out of order after seq {t['seq']}")
        elif seq != expected:
            if t["whole"]:
                every = f" (every {n})" if n > 1 else ""
                problems.append(f"{name}: seq {expected} to {seq - n}{every} missing before it")
            t["whole"] = False
        kept = known_heads.pop((tenant, seq), None)
        if kept is not None and kept != row["hash"]:
            problems.append(f"{name}: the chain no longer passes through the head you kept ({kept})")
        t["seq"], t["hash"] = seq, row["hash"]
    for tenant in dict.fromkeys(tenant for tenant, _ in state):
        n = chains.get(tenant, 1)
        cut = [stripe for stripe in range(n) if not state.get((tenant, stripe), {}).get("done")]
        if n == 1 and cut:
            problems.append(f"{tenant}: no head row: the file was cut short")
        elif cut:
            problems.append(f"{tenant}: no head row for chain {', '.join(map(str, cut))}: the file was cut short")
    problems += [f"{tenant} seq {seq}: the kept head is not in this export" for tenant, seq in known_heads]
    return problems, proven


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export")
    parser.add_argument("--known-head", action="append", default=[], metavar="TENANT:SEQ:HASH")
    args = parser.parse_args()
    known = {}
    for item in args.known_head:
        tenant, seq, digest = item.rsplit(":", 2)
        known[(tenant, int(seq))] = digest
    problems, proven = verify(args.export, known)
    if problems:
        # Nothing in a file found broken is stated as verified: a row further on may rest on the broken one.
        for problem in problems:
            print("BROKEN:", problem)
        print(f"NOT VERIFIED: {len(problems)} problem(s) found; nothing in this file is vouched for")
        return 1
    for line in proven:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
