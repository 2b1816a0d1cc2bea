"""What OpenTelemetry tracing costs (issue 28): the consumer's and the producer's CPU time per
message with OpenTelemetry absent (as without the ``otel`` extra), installed without an SDK
(tracing off: a flag read per message) and with the SDK and an exporter that drops every span
(spans made, none shipped), in the same run.

Each mode runs in a child process of its own (bench/tracing_child.py: the API cannot be
un-imported, nor a tracer provider unset), the three one after the other in each round, in
reverse order every other round; the figures are the medians over the rounds, each beside the
"absent" figure of the same run.
"""

from __future__ import annotations

import json
import statistics

from .harness import Bench, Child, Row
from .sizes import Sizes

MODES = ("absent", "api", "sdk")
WHAT = {
    "deliver": "Consumer.deliver, no-op handler, no Redis",
    "burst": "burst consumer through Redis (claim, handler, ack)",
    "schedule": "Queue.schedule, one script call each",
}
LABEL = {
    "absent": "OpenTelemetry absent",
    "api": "API installed, no SDK",
    "sdk": "SDK, spans dropped",
}


def tracing(bench: Bench, sizes: Sizes) -> list[Row]:
    count = max(200, sizes.delivery // 10)
    per_mode: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for r in range(sizes.rounds):
        for mode in MODES if r % 2 == 0 else reversed(MODES):
            child = Child(["-m", "bench.tracing_child", mode, str(count), bench.url])
            out, _err = child.wait(sizes.timeout)
            per_mode[mode].append(json.loads(out.strip().splitlines()[-1]))
            bench.flush()
    rows: list[Row] = []
    for part, what in WHAT.items():
        base = statistics.median(x[part] for x in per_mode["absent"])
        for mode in MODES:
            value = statistics.median(x[part] for x in per_mode[mode])
            pairs = zip(per_mode[mode], per_mode["absent"], strict=True)
            ratios = [x[part] / a[part] for x, a in pairs]
            rows.append(
                Row(
                    key=f"tracing.{part}.{mode}",
                    what=f"{what}: {LABEL[mode]}",
                    value=round(value, 2),
                    unit="µs CPU/message",
                    baseline=round(base, 2),
                    baseline_what=f"{LABEL['absent']}, same run",
                    ratio=round(statistics.median(ratios), 3),
                    note=f"+{value - base:.2f} µs/message" if mode != "absent" else "",
                    extra={"rounds": [x[part] for x in per_mode[mode]], "count": count},
                )
            )
    return rows
