from django.contrib import admin

from .models import SalesReport


@admin.register(SalesReport)
class SalesReportAdmin(admin.ModelAdmin):
    list_display = [
        "due_at",
        "orders_paid",
        "orders_closed",
        "orders_open",
        "sms_sent",
        "written_at",
        "tick",
    ]
