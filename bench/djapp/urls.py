from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path

import django_delayqueue as dq

from .settings import QUEUE


def schedule_view(request: HttpRequest, order: int) -> HttpResponse:
    """What a shop view does: schedule a message (due now) and answer."""
    message_id = dq.schedule(QUEUE, {"order": order})
    return HttpResponse(message_id, content_type="text/plain")


urlpatterns = [path("schedule/<int:order>/", schedule_view)]
