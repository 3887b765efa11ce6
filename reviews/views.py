from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from reviews import queries


@login_required
def home(request: HttpRequest) -> HttpResponse:
    counts = queries.queue_counts(request.user)
    return render(request, "reviews/home.html", {"counts": counts})
