from django.apps import AppConfig


class DelayQueueConfig(AppConfig):
    name = "django_delayqueue"
    verbose_name = "Delay queues"
    default_auto_field = "django.db.models.BigAutoField"
