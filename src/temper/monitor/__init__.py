"""temper.monitor: what a run reports, and the checks that keep it honest.

`sinks.py` (the `MetricSink` protocol, JSONL, `FanOutSink`), `external_sinks.py`
(TensorBoard, W&B, MLflow; each package imported only when configured),
`health.py` (`HealthMonitor`: per-step guardrails with warn, stop or skip;
thresholds in `temper.config.health`), `progress.py` (a live bar on a terminal,
plain lines in a log), `profile.py` (stage spans; a Chrome trace of one step),
`report.py` (plots and report.html), `inspect.py` (`temper inspect`, `temper
compare`), `dashboard/` (`temper dash`). See docs/monitoring.md and
docs/dashboard.md.
"""
