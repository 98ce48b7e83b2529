"""The live dashboard: `temper dash [RUNS_DIR]` (see docs/dashboard.md).

A FastAPI JSON API over the run directories under RUNS_DIR and a static page
(plain HTML/JS/CSS in `static/`, no build step, no CDN) that charts metrics
across runs, shows per-stage step times, alerts, and a trajectory browser
with token-level heat maps.
"""

from temper.monitor.dashboard.server import DashboardServer, create_app, serve

__all__ = ["DashboardServer", "create_app", "serve"]
