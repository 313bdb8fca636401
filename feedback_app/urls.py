from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from feedback_app.views import (
    compare,
    dashboard,
    health,
    history,
    intervene,
    projects,
    quality,
    steps,
    tokens,
    training,
    training_runs,
    trajectories,
    workspace,
)

urlpatterns = [
    path("", projects.home, name="home"),
    path("projects/<int:project_pk>/", projects.project_detail, name="project-detail"),
    path("projects/<int:project_pk>/quality/", quality.project_quality, name="project-quality"),
    # The researcher's dashboard (feedback_app/views/dashboard.py).
    path("projects/<int:project_pk>/dashboard/", dashboard.overview, name="project-dashboard"),
    path(
        "projects/<int:project_pk>/dashboard/query-strategy/",
        dashboard.set_query_strategy,
        name="project-query-strategy",
    ),
    path("projects/<int:project_pk>/models/", dashboard.models_page, name="project-models"),
    path("projects/<int:project_pk>/leaderboard/", dashboard.leaderboard, name="project-leaderboard"),
    path(
        "projects/<int:project_pk>/trajectories/<int:trajectory_pk>/",
        trajectories.trajectory_detail,
        name="trajectory-detail",
    ),
    path("projects/<int:project_pk>/compare/", compare.compare_next, name="compare-next"),
    path("projects/<int:project_pk>/compare/<int:assignment_pk>/", compare.compare_submit, name="compare-submit"),
    path(
        "projects/<int:project_pk>/assignments/<int:assignment_pk>/skip",
        workspace.skip_assignment,
        name="assignment-skip",
    ),
    path("projects/<int:project_pk>/history/", history.history, name="history"),
    # The training page and its runs (feedback_app/views/training.py, training_runs.py, launch_form.py).
    path("projects/<int:project_pk>/training/", training.training_page, name="training"),
    path("projects/<int:project_pk>/training/runs/", training_runs.runs_fragment, name="training-runs"),
    path("projects/<int:project_pk>/training/snapshots/", training.make_snapshot, name="training-snapshot"),
    path("projects/<int:project_pk>/training/launch/", training.launch, name="training-launch"),
    path("projects/<int:project_pk>/training/estimate/", training.launch_estimate, name="training-estimate"),
    path(
        "projects/<int:project_pk>/training/runs/<int:run_pk>/cancel/",
        training_runs.cancel_run,
        name="training-cancel",
    ),
    path("projects/<int:project_pk>/training/runs/<int:run_pk>/", training_runs.run_page, name="training-run"),
    path("projects/<int:project_pk>/training/runs/<int:run_pk>/rerun/", training.rerun_run, name="training-rerun"),
    path(
        "projects/<int:project_pk>/history/<str:kind>/<int:label_pk>/",
        history.label_revisions,
        name="history-label",
    ),
    # Step labels, critiques, ratings and interventions (feedback_app/views/steps.py, intervene.py).
    path("projects/<int:project_pk>/label/", steps.label_next, name="label-next"),
    path(
        "projects/<int:project_pk>/trajectories/<int:trajectory_pk>/steps/",
        steps.trajectory_steps,
        name="trajectory-steps",
    ),
    path(
        "projects/<int:project_pk>/trajectories/<int:trajectory_pk>/steps/<int:index>/label",
        steps.step_label,
        name="step-label",
    ),
    path(
        "projects/<int:project_pk>/trajectories/<int:trajectory_pk>/steps/<int:index>/first-error",
        steps.first_error,
        name="step-first-error",
    ),
    path("projects/<int:project_pk>/trajectories/<int:trajectory_pk>/critiques/", steps.critique, name="critique-add"),
    path("projects/<int:project_pk>/trajectories/<int:trajectory_pk>/rating", steps.rating, name="trajectory-rate"),
    path("projects/<int:project_pk>/assignments/<int:assignment_pk>/finish", steps.finish, name="step-labels-finish"),
    path(
        "projects/<int:project_pk>/trajectories/<int:trajectory_pk>/steps/<int:index>/intervene",
        intervene.intervene,
        name="intervene",
    ),
    path(
        "projects/<int:project_pk>/interventions/<int:intervention_pk>/",
        intervene.intervention_status,
        name="intervention-status",
    ),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("account/tokens/", tokens.token_list, name="api-tokens"),
    path("account/tokens/<int:token_pk>/revoke/", tokens.revoke_token, name="api-token-revoke"),
    path("api/", include("feedback_app.api.urls")),
    path("admin/", admin.site.urls),
    path("healthz", health.healthz, name="healthz"),
    path("favicon.ico", health.favicon, name="favicon"),
]

handler400 = "feedback_app.views.errors.bad_request"
handler403 = "feedback_app.views.errors.permission_denied"
handler404 = "feedback_app.views.errors.page_not_found"
handler500 = "feedback_app.views.errors.server_error"
