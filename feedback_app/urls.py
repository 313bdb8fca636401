from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from feedback_app.views import health, projects, trajectories

urlpatterns = [
    path("", projects.home, name="home"),
    path("projects/<int:project_pk>/", projects.project_detail, name="project-detail"),
    path(
        "projects/<int:project_pk>/trajectories/<int:trajectory_pk>/",
        trajectories.trajectory_detail,
        name="trajectory-detail",
    ),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/", include("feedback_app.api.urls")),
    path("admin/", admin.site.urls),
    path("healthz", health.healthz, name="healthz"),
]
