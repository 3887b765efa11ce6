from __future__ import annotations

from django.urls import path

from reviews import account_views, audit_views, drills, incidents, views

app_name = "reviews"

urlpatterns = [
    path("", views.home, name="home"),
    path("export.<str:fmt>", audit_views.export, name="export"),
    path("queues/<slug:queue>/", views.attempt_list, name="queue"),
    path("attempts/", views.attempt_list, name="search"),
    path("attempts/assign/", views.bulk_assign, name="bulk_assign"),
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
    path("drills/", drills.drill_list, name="drills"),
    path("drills/<int:pk>/", drills.drill_detail, name="drill"),
    path("attempts/<int:pk>/report/", audit_views.attempt_report, name="attempt_report"),
    path("attempts/<int:pk>/report.pdf", audit_views.attempt_report_pdf, name="attempt_report_pdf"),
    path("attempts/<int:pk>/incident/", audit_views.incident_report, name="incident_report"),
    path("attempts/<int:pk>/incident.pdf", audit_views.incident_report_pdf, name="incident_report_pdf"),
    path("drills/<int:pk>/report/", audit_views.drill_report, name="drill_report"),
    path("drills/<int:pk>/report.pdf", audit_views.drill_report_pdf, name="drill_report_pdf"),
]
