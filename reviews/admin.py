from __future__ import annotations

from django.contrib import admin

from ledgerdash.ledger.models import Membership


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["tenant", "role"]
    search_fields = ["user__username"]
    raw_id_fields = ["user"]
