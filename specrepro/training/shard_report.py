"""How fast a shard build wrote target text: the shard-NNNN.json records a build leaves beside its shards
(training/shards.py: target-written tokens, seconds, batch, threads, load averages), gathered into one file.

python -m specrepro.training.shard_report --folder $SPECREPRO_HOME/drafts/long/data/shards-KEY \
    --out figures/drafts/feature_data.json

Per shard: its kind (news requests on even shards, code prefixes on odd ones), tokens, seconds, tokens per
second and the load average before it started; in all: tokens, seconds, tokens per hour; and per kind the median
rate over the shards that started with the load average under `--quiet-load` (the others ran beside other jobs).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from ..engines.machine import RunRecord
from ..files import write_json


def shard_rates(folder, quiet_load: float = 2.2) -> dict:
    """{"shards": [...], "total": {...}, "quiet_median_tokens_per_second": {"news": r, "code": r}} of a folder's
    shard records. Raises ValueError naming the folder when it holds none."""
    paths = sorted(Path(folder).glob("shard-[0-9][0-9][0-9][0-9].json"))
    if not paths:
        raise ValueError(f"no shard-NNNN.json records in {folder}")
    rows = []
    for path in paths:
        rec = json.loads(path.read_text())
        index = int(re.search(r"(\d{4})", path.name).group(1))
        rows.append({"shard": index, "kind": "news" if index % 2 == 0 else "code",
                     "sampled": (index // 2) % 2 == 1, "target_written_tokens": rec["target_written_tokens"],
                     "seconds": round(rec["seconds"], 1),
                     "tokens_per_second": round(rec["target_written_tokens"] / rec["seconds"], 1),
                     "batch": rec.get("batch"), "threads": rec.get("threads"),
                     "load_average_before": rec.get("loadavg_before")})
    tokens, seconds = sum(r["target_written_tokens"] for r in rows), sum(r["seconds"] for r in rows)
    quiet = {}
    for kind in ("news", "code"):
        rates = [r["tokens_per_second"] for r in rows if r["kind"] == kind and r["load_average_before"]
                 and r["load_average_before"][0] < quiet_load]
        quiet[kind] = {"median": statistics.median(rates) if rates else None, "n": len(rates)}
    return {"shards": rows, "total": {"shards": len(rows), "target_written_tokens": tokens, "seconds": round(seconds, 1),
                                       "tokens_per_hour": round(3600 * tokens / seconds)},
            "quiet_load_below": quiet_load, "quiet_median_tokens_per_second": quiet}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specrepro.training.shard_report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", required=True, help="a shards-KEY folder of a build")
    ap.add_argument("--out", required=True)
    ap.add_argument("--quiet-load", type=float, default=2.2)
    args = ap.parse_args(argv)
    record = RunRecord({"out": args.out, "quiet_load": args.quiet_load})
    try:
        report = shard_rates(args.folder, args.quiet_load)
    except ValueError as err:
        ap.error(str(err))
    report["meta"] = record.meta(shard_folder=Path(args.folder).name,
                                 what="the records a shard build wrote beside its shards, gathered")
    write_json(Path(args.out), report)
    print(json.dumps({k: report[k] for k in ("total", "quiet_median_tokens_per_second")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
