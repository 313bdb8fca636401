"""Export and snapshot endpoints."""

from django.urls import path

from feedback_app.api.exports import ExportView, SnapshotDetailView, SnapshotDownloadView, SnapshotListView

urlpatterns = [
    path("projects/<int:project_pk>/exports/<str:kind>", ExportView.as_view(), name="api-export"),
    path("projects/<int:project_pk>/snapshots", SnapshotListView.as_view(), name="api-snapshots"),
    path("snapshots/<int:snapshot_pk>", SnapshotDetailView.as_view(), name="api-snapshot"),
    path("snapshots/<int:snapshot_pk>/download", SnapshotDownloadView.as_view(), name="api-snapshot-download"),
]
