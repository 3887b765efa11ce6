from __future__ import annotations

from django.urls import path
from django.views.generic import RedirectView

from reviews import (
    account_views,
    approvals,
    audit_views,
    bulk,
    drills,
    incidents,
    notifications,
    tenant_settings,
    views,
)

app_name = "reviews"

urlpatterns = [
    path("", views.home, name="home"),
    path("trends/", views.trends, name="trends"),
    path("export.<str:fmt>", audit_views.export, name="export"),
    path("queues/<slug:queue>/", views.attempt_list, name="queue"),
    path("approvals/", approvals.approvals, name="approvals"),
    path("attempts/", views.attempt_list, name="search"),
    path("attempts/assign/", views.bulk_assign, name="bulk_assign"),
    path("attempts/bulk/<slug:decision>/", bulk.bulk_decide, name="bulk_decide"),
    path("attempts/<int:pk>/", views.attempt_detail, name="attempt"),
    path("attempts/<int:pk>/claim/", views.attempt_claim, name="claim"),
    path("attempts/<int:pk>/assign/", views.attempt_assign, name="assign"),
    path("attempts/<int:pk>/unassign/", views.attempt_unassign, name="unassign"),
    path("attempts/<int:pk>/comment/", views.attempt_comment, name="comment"),
    path("attempts/<int:pk>/recheck/", views.attempt_recheck, name="recheck"),
    path("attempts/<int:pk>/verify/", views.attempt_verify, name="verify"),
    path("attempts/<int:pk>/fail/", views.attempt_mark_failed, name="mark_failed"),
    path("attempts/<int:pk>/abandon/", views.attempt_abandon, name="abandon"),
    path("attempts/<int:pk>/retry/", views.retry_request, name="retry_request"),
    path("attempts/<int:pk>/approve/", views.retry_approve, name="approve"),
    path("attempts/<int:pk>/reject/", views.retry_reject, name="reject"),
    path("incidents/", incidents.incident_list, name="incidents"),
    path("incidents/<int:pk>/", incidents.incident_detail, name="incident"),
    path("incidents/<int:pk>/claim/", incidents.incident_claim, name="incident_claim"),
    path("incidents/<int:pk>/resolve/", incidents.incident_resolve, name="incident_resolve"),
    path("members/", account_views.members, name="members"),
    path("members/unlock/", account_views.member_unlock, name="member_unlock"),
    path("tenants/<slug:slug>/settings/", tenant_settings.tenant_settings, name="tenant_settings"),
    path("tenants/<slug:slug>/settings/role/", tenant_settings.member_role, name="member_role"),
    path("notifications/", notifications.notification_list, name="notifications"),
    path("notifications/channels/new/", notifications.channel_create, name="channel_create"),
    path("notifications/channels/<int:pk>/", notifications.channel_edit, name="channel_edit"),
    path("notifications/rules/new/", notifications.rule_create, name="rule_create"),
    path("notifications/rules/<int:pk>/", notifications.rule_edit, name="rule_edit"),
    path("notifications/deliveries/<uuid:pk>/resend/", notifications.delivery_resend, name="delivery_resend"),
    path("drills/", drills.drill_list, name="drills"),
    path("drills/<int:pk>/", drills.drill_detail, name="drill"),
    path("attempts/<int:pk>/report/", audit_views.attempt_report, name="attempt_report"),
    path("attempts/<int:pk>/report.pdf", audit_views.attempt_report_pdf, name="attempt_report_pdf"),
    path("attempts/<int:pk>/side-effect/", audit_views.side_effect_report, name="side_effect_report"),
    path("attempts/<int:pk>/side-effect.pdf", audit_views.side_effect_report_pdf, name="side_effect_report_pdf"),
    # Where the side effect's report was before it had its name (an incident is something else): for bookmarks.
    path(
        "attempts/<int:pk>/incident/",
        RedirectView.as_view(pattern_name="reviews:side_effect_report", permanent=True),
    ),
    path(
        "attempts/<int:pk>/incident.pdf",
        RedirectView.as_view(pattern_name="reviews:side_effect_report_pdf", permanent=True),
    ),
    path("drills/<int:pk>/report/", audit_views.drill_report, name="drill_report"),
    path("drills/<int:pk>/report.pdf", audit_views.drill_report_pdf, name="drill_report_pdf"),
]
