"""The roofline table of specrepro.bench.ops for native runners: bytes and multiply-adds from the model's shape."""
import shutil

import pytest
import torch

from specrepro.bench import ops
from specrepro.engines import native
from test_native import model

REASON = native.unavailable_reason(torch.bfloat16, "cpu") if shutil.which("g++") is None else None
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no native build here: {REASON}")


def test_roofline_counts_the_weights_once_and_the_products_per_row(monkeypatch):
    monkeypatch.setattr(ops, "stream_gbps", lambda: 10.0)  # 10 GB/s: 1 MB takes 0.1 ms
    monkeypatch.setattr(ops, "native_gmacs", lambda: 1.0)  # 1 G multiply-adds/s: 1 M take 1 ms
    m = model(0, vocab=64, layers=2, heads=4, kv_heads=2, hidden=64)
    table = ops.roofline(m, 10, [1, 2, 4], {1: 1.0, 2: 1.2, 4: 2.0})
    inter, d = 2 * 64 + 6, 16
    params = 2 * (64 * (4 + 2 * 2) * d + 4 * d * 64 + 3 * 64 * inter) + 64 * 64
    assert table["weight_bytes"] == 2 * params and table["kv_bytes"] == 2 * 2 * 2 * d * 4 * 10
    rows = table["rows"]
    assert rows[1]["floor_ms"] == rows[4]["floor_ms"] == pytest.approx((2 * params + table["kv_bytes"]) / 1e7)
    attention = 2 * 2 * 4 * d * (4 * 10 + 10)  # 4 rows at positions 10..13 see 11..14 keys
    assert rows[4]["roof_ms"] == pytest.approx((4 * params + attention) / 1e6)
    assert rows[2]["measured_over_bound"] == pytest.approx(1.2 / max(rows[2]["floor_ms"], rows[2]["roof_ms"]))


def test_the_int8_roofline_streams_a_byte_and_a_scale_per_32_weights(monkeypatch):
    monkeypatch.setattr(ops, "stream_gbps", lambda: 10.0)
    asked = []
    monkeypatch.setattr(ops, "native_gmacs", lambda weights="bfloat16": asked.append(weights) or 2.0)
    m = model(0, vocab=64, layers=2, heads=4, kv_heads=2, hidden=64)
    bf16 = ops.roofline(m, 10, [1], {1: 1.0})
    int8 = ops.roofline(m, 10, [1], {1: 1.0}, weights="int8")
    params = bf16["weight_bytes"] // 2
    assert int8["weight_bytes"] == params + params // 32 * 4 and int8["weights"] == "int8"
    assert asked == ["bfloat16", "int8"]


def test_the_kernel_rate_and_the_bandwidth_are_measured():
    assert ops.native_gmacs(rows=2, reps=2) > 0 and ops.stream_gbps(reps=2, mb=8) > 0
    assert ops.native_gmacs(rows=2, reps=2, weights="int8") > 0
