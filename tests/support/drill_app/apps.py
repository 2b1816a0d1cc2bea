from __future__ import annotations

from django.apps import AppConfig


class DrillConfig(AppConfig):
    name = "drill_app"
    label = "drill_app"
    verbose_name = "Fault drill handlers"

    def ready(self) -> None:
        from . import atomic, handlers  # noqa: F401  (connect the receivers)
