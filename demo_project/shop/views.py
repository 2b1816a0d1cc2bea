from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from .models import Order, Store


def index(request: HttpRequest) -> HttpResponse:
    context = {
        "orders": Order.objects.all()[:20],
        "stores": Store.objects.prefetch_related("products")[:20],
    }
    return render(request, "shop/index.html", context)
