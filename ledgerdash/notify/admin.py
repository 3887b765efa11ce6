"""Notifications in /admin/: to read. Channels and rules change on the
dashboard's Notifications page, where every change is an event in the
tenant's chain; a channel's signing secret is never shown here."""

from __future__ import annotations

from django.contrib import admin

from ledgerdash.ledger.admin import ReadOnlyAdmin
from ledgerdash.notify.models import Channel, Delivery, DeliveryTry, Rule


@admin.register(Channel)
class ChannelAdmin(ReadOnlyAdmin):
    list_display = ["name", "tenant", "kind", "target", "enabled", "updated_at"]
    list_filter = ["kind", "enabled", "tenant"]
    exclude = ["secret"]


@admin.register(Rule)
class RuleAdmin(ReadOnlyAdmin):
    list_display = ["event", "tenant", "channel", "audience", "enabled", "updated_at"]
    list_filter = ["event", "enabled", "tenant"]


class DeliveryTryInline(admin.TabularInline):
    model = DeliveryTry
    fields = ("number", "at", "ok", "status_code", "error", "duration_ms", "worker")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = ["id", "tenant", "channel", "event", "status", "tries", "next_try_at", "created_at"]
    list_filter = ["status", "event", "tenant"]
    search_fields = ["id", "dedup_key"]
    inlines = [DeliveryTryInline]
