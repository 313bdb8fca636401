"""The personal API tokens page: list my tokens, make one (its key is shown once), revoke one."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from feedback_app.models import ApiToken


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What the token is for, e.g. 'eval notebook'.")
    read_only = forms.BooleanField(required=False, help_text="Only GET, HEAD and OPTIONS requests.")


@require_http_methods(["GET", "POST"])
@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST or None)
    new_key = None
    if request.method == "POST" and form.is_valid():
        token, new_key = ApiToken.issue(request.user, form.cleaned_data["name"], form.cleaned_data["read_only"])
        form = TokenForm()
    context = {"tokens": ApiToken.objects.filter(user=request.user), "form": form, "new_key": new_key}
    # The key is in this response only: never cache it.
    response = render(request, "feedback_app/tokens.html", context, status=400 if form.errors else 200)
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@login_required
def revoke_token(request: HttpRequest, token_pk: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=token_pk, user=request.user)
    token.revoke()
    messages.success(request, f"Token “{token.name}” revoked: it no longer works.")
    return redirect("api-tokens")
