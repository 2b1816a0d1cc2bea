from django.contrib import admin

from .models import Order, Product, SentSms, Store


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["id", "amount", "status", "created"]
    list_filter = ["status"]


class ProductInline(admin.TabularInline):
    model = Product
    extra = 0


@admin.register(Store)
class StoreAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "phone", "created"]
    inlines = [ProductInline]


@admin.register(SentSms)
class SentSmsAdmin(admin.ModelAdmin):
    list_display = ["sent_at", "phone", "kind", "store", "text"]
    list_filter = ["kind"]
