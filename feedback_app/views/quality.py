"""Label quality for researchers: agreement between annotators, gold accuracy and time per label."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from feedback_app.access import get_project_for_role
from feedback_app.agreement import project_quality as compute_quality
from feedback_app.models import Role


@require_GET
@login_required
@vary_on_headers("HX-Request")
def project_quality(request: HttpRequest, project_pk: int) -> HttpResponse:
    """The quality panel: a fragment for htmx (the project page loads it), else a page of its own."""
    project, membership = get_project_for_role(request, project_pk, Role.RESEARCHER, Role.ADMIN)
    min_shared = request.GET.get("min_shared", "5")
    if not min_shared.isdigit() or int(min_shared) < 1:
        return HttpResponseBadRequest("min_shared: give a whole number of shared units, at least 1.")
    template_name = "feedback_app/_quality.html"
    if request.htmx:
        template_name += "#quality"
    context = {"project": project, "quality": compute_quality(project, min_shared=int(min_shared))}
    return render(request, template_name, context)
