"""The project's URLs plus a second admin site at ``/bench-admin/``, served
only by the queue benchmark's gunicorn (bench/settings.py).

The admin as shipped (``/admin/``) lists attempts with ``list_filter`` on
state, tenant and tool: every changelist page then runs a full-table
``SELECT DISTINCT tool_name`` for the tool filter's choices, and counts the
whole table for "N total", whatever page it shows. Those costs are the same
on the first page as 90% deep, so next to the dashboard they measure the
filter sidebar, not OFFSET against keyset paging. The second site lists the
same rows with the same columns, ordering, joins and page size, filtered by
the same query string, without the sidebar and the full count: what is left
is the admin's paging.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from ledgerdash.ledger.admin import AttemptAdmin
from ledgerdash.ledger.models import Attempt
from ledgerdash.urls import urlpatterns as project_urlpatterns


class PagingOnlyAttemptAdmin(AttemptAdmin):
    list_filter = []
    show_full_result_count = False


site = admin.AdminSite(name="bench_admin")
site.register(Attempt, PagingOnlyAttemptAdmin)

urlpatterns = [path("bench-admin/", site.urls), *project_urlpatterns]
