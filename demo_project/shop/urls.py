from django.urls import path

from . import views

app_name = "shop"

urlpatterns = [
    path("", views.index, name="index"),
    path("timeline/", views.timeline_fragment, name="timeline"),
    path("orders/", views.create_order, name="create_order"),
    path("orders/<int:pk>/pay/", views.pay_order, name="pay_order"),
    path("stores/", views.create_store, name="create_store"),
    path("stores/<int:pk>/products/", views.add_product, name="add_product"),
    path("sms/", views.sent_sms, name="sent_sms"),
]
