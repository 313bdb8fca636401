"""Sessions and the logged-in user, read with hand-written SQL (feedback_app/sessions.py): they must admit and refuse
exactly whom Django's own database sessions and ModelBackend would."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.sessions.models import Session
from django.test import Client
from django.urls import reverse
from django.utils import timezone

pytestmark = pytest.mark.django_db


def logged_in(annotator) -> Client:
    client = Client()
    response = client.post(reverse("login"), {"username": "annotator", "password": "pw-annotator"})
    assert response.status_code == 302
    return client


def is_logged_in(client: Client) -> bool:
    response = client.get(reverse("home"))
    return response.status_code == 200 and "annotator" in response.content.decode()


def test_a_login_through_the_form_lasts_across_requests(annotator, project):
    client = logged_in(annotator)
    assert is_logged_in(client)
    assert client.get(reverse("compare-next", args=[project.pk])).status_code == 200


def test_a_cookie_from_before_the_logout_no_longer_admits(annotator):
    client = logged_in(annotator)
    stolen = Client()
    stolen.cookies = client.cookies.__class__(client.cookies)
    assert is_logged_in(stolen)
    client.post(reverse("logout"))
    assert not Session.objects.exists()
    assert stolen.get(reverse("home")).status_code == 302


def test_an_expired_session_is_sent_to_log_in(annotator):
    client = logged_in(annotator)
    Session.objects.update(expire_date=timezone.now() - timedelta(seconds=1))
    response = client.get(reverse("home"))
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_a_deactivated_or_deleted_user_is_logged_out_on_the_next_request(annotator, django_user_model):
    client = logged_in(annotator)
    django_user_model.objects.filter(pk=annotator.pk).update(is_active=False)
    assert client.get(reverse("home")).status_code == 302
    django_user_model.objects.filter(pk=annotator.pk).update(is_active=True)
    client = logged_in(annotator)
    django_user_model.objects.filter(pk=annotator.pk).update(username="renamed")
    assert client.get(reverse("home")).status_code == 200  # the id, not the name, identifies the user
    annotator.memberships.all().delete()
    django_user_model.objects.filter(pk=annotator.pk).delete()
    assert client.get(reverse("home")).status_code == 302


def test_a_password_change_ends_the_other_sessions(annotator):
    client = logged_in(annotator)
    annotator.set_password("a new long password")
    annotator.save()
    assert client.get(reverse("home")).status_code == 302
