"""The loaded model's profile (``injection/model/profiles.py``) as a Prometheus info metric,
exported by the worker's ``EngineCollector``: ``kvi_model_profile_info``."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import InfoMetricFamily, Metric

from injection.model import profiles


def profile_info(adapter: Any) -> Metric:
    """Its name, model key, whether it was calibrated, the default guidance strength, and
    whether the reminder, the decoding constraints and the loop guard run by default."""
    p = profiles.summary(adapter)
    info = InfoMetricFamily("kvi_model_profile", "The loaded model's profile: its defaults "
                            "and whether they were calibrated on it")
    info.add_metric([], {"name": p["name"], "model_key": p["model_key"],
                         "calibrated": str(p["calibrated"]).lower(),
                         "guidance_default": str(p["guidance"]),
                         "reminder_default": "on" if p["reminder"] else "off",
                         "constraints_default": "on" if p["constraints"] else "off",
                         "loop_guard_default": "on" if p["loop_guard"] else "off"})
    return info
