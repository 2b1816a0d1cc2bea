from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("delayqueue/", include("django_delayqueue.urls")),  # metrics/ and health/
    path("", include("demo_project.shop.urls")),
]
