"""Export and snapshot endpoints."""

urlpatterns: list = []
