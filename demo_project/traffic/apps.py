from django.apps import AppConfig


class TrafficConfig(AppConfig):
    """The demo's world around the shop: an SMS gateway, a partner, reports, an export task and
    a generator of customers (``manage.py demo_traffic``, started by ``make demo``)."""

    name = "demo_project.traffic"
    label = "traffic"
    verbose_name = "Demo traffic"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from demo_project.shop.actions import order_paid

        from .partner import schedule_callback

        # The shop says an order was paid; the partner is told of it by a message of its own.
        order_paid.connect(schedule_callback, dispatch_uid="traffic.partner-callback")
